"""Hosts the controller acts on. Every stage (healthcheck, monitors, case run, collection) goes
through this interface, so the SSH host later is a second implementation, not a second code path."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from flagperf.hosts.container_policy import LINKS_LISTED
from flagperf.hosts.threads import RoundsStopped, stop_requested
from flagperf.paths import NAME_PATTERN, PROJECT_ROOT, walk_source
from flagperf.results.bounded import MAX_RECORD_BYTES, read_bounded, read_end

LineSink = Callable[[str], None]
logger = logging.getLogger("flagperf.hosts.local")
PARENT_PID_ENV = "FLAGPERF_PARENT_PID"  # the pid of the process that started a case or monitor
TAIL_BYTES = 64 * 1024  # the end of a log read for its last lines: far more than a few lines take
# In a host's work root, beside the runs' folders and never in one: the controller's own record of the attempts whose
# case process their runtime saw end (tasks.container.seen_ended). A round's container gets its run's folder, never
# the work root (flagperf.hosts.docker), so case code there cannot forge one.
ENDED_ROOT = ".ended"
ENDED_MARKER = "ended.json"  # in an attempt's folder under ended_path: the exit code the runtime saw


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    exit_code: int | None  # negative: killed by that signal; None: never started (or lost: see ``link``)
    timed_out: bool
    seconds: float
    # What the link to the host's engine said while the command ran (one line): beside an exit code it is context
    # (the link dropped and came back); with none the command was lost to it and may be tried again.
    link: str | None = None


@dataclass
class BackgroundProcess:
    argv: list[str]
    pid: int
    handle: Any = field(repr=False, default=None)


class Host(ABC):
    """An accelerator host: where cases and monitors run, and where their files are written."""

    name: str
    project_root: Path  # the deployed project (cases, vendor_images, flagperf)
    python: str
    work_root: Path  # scratch space for jobs; collected into the controller's results

    @abstractmethod
    def run(self, argv: list[str], *, timeout: float, log_path: Path | None = None,
            on_line: LineSink | None = None, pid_file: Path | None = None) -> CommandResult: ...

    @property
    def ended_root(self) -> Path | None:
        """Where the controller keeps its markers of attempts seen to end on this host (``ended_path``), outside every
        folder a round's case process or container is given to write: the work root's ENDED_ROOT. A case process run
        as the host's user (no container) can still reach it: it guards against a case's files, not a hostile
        process. None: no marker is kept, and no attempt here counts as seen to end."""
        return self.work_root / ENDED_ROOT

    def ended_path(self, folder: Path) -> Path | None:
        """The controller's markers of the attempts under ``folder`` (a run's, a round's or an attempt's folder in
        the work root); None where there is none (no ended_root, a folder outside the work root)."""
        root = self.ended_root
        if root is None or not folder.is_relative_to(self.work_root) or folder == self.work_root:
            return None
        return root / folder.relative_to(self.work_root)

    def ended_marker(self, job_dir: Path) -> Path | None:
        """The controller's marker that the attempt in ``job_dir`` was seen to end (tasks.container.seen_ended)."""
        folder = self.ended_path(job_dir)
        return None if folder is None else folder / ENDED_MARKER

    def ended_when_interrupted(self, log_path: Path) -> int | None:
        """The exit code of the command ``run`` was running with ``log_path`` when it was interrupted (it raised), where
        this host saw that command end before it raised; None where it did not (a remote host: its command may still
        be stopping there)."""
        return None

    @abstractmethod
    def spawn(self, argv: list[str], *, log_path: Path) -> BackgroundProcess: ...

    @abstractmethod
    def terminate(self, proc: BackgroundProcess, grace_s: float = 10.0) -> int | None: ...

    @abstractmethod
    def is_running(self, proc: BackgroundProcess) -> bool: ...

    @abstractmethod
    def write_text(self, path: Path, text: str, mode: int | None = None) -> None:
        """Write ``path`` whole (a temporary file, then a rename); ``mode`` (0o600 for secrets) from its creation."""

    @abstractmethod
    def fetch_tree(self, remote: Path, local: Path) -> dict[str, int]:
        """Copy the regular files under the folder ``remote`` on the host to ``local`` on the controller,
        flushed to disk; links are neither followed nor copied (a case cannot make the controller copy
        what it links to). Returns the size of every file it was asked to copy, by relative path, so the
        caller can read the copy back before deleting the original."""

    @abstractmethod
    def remove_tree(self, remote: Path) -> None: ...

    @abstractmethod
    def remove_if_empty(self, remote: Path) -> None:
        """Remove the folder ``remote`` only where it is empty (one rmdir: another run's files in it keep it, with no
        listing between that a run could race); nothing where it is not, or is gone."""

    @abstractmethod
    def exists(self, remote: Path) -> bool: ...

    @abstractmethod
    def list_folder(self, remote: Path) -> list[str]:
        """The names in the folder ``remote`` on the host; OSError when it cannot be listed."""

    @abstractmethod
    def read_text(self, remote: Path, max_bytes: int = MAX_RECORD_BYTES) -> str:
        """A regular file on the host as text, read only when it holds at most ``max_bytes`` (a result, a job):
        OSError when it cannot be read, ValueError (one line naming it) when it is larger or not a regular file;
        never read whole first, so a huge or endless file cannot fill the controller's memory."""

    @abstractmethod
    def read_end(self, remote: Path, max_bytes: int) -> str:
        """The last ``max_bytes`` of a regular file on the host as text (a log, however long it grew); OSError
        when it cannot be read, ValueError when it is not a regular file."""

    def tail(self, remote: Path, lines: int, max_bytes: int = TAIL_BYTES) -> list[str]:
        """The last non-empty lines of a text file on the host, from its last ``max_bytes`` only ([] when it
        cannot be read)."""
        try:
            text = self.read_end(remote, max_bytes)
        except (OSError, ValueError):
            return []
        return [line.strip() for line in text.splitlines() if line.strip()][-lines:]

    @abstractmethod
    def controller_pid(self) -> int:
        """The process on the host whose exit means nobody is watching (monitors stop then)."""

    @abstractmethod
    def disk_free(self, path: Path) -> int: ...

    def clock(self) -> float:
        """The host's wall clock (time.time()), read by the cheapest round trip the host allows."""
        return time.time()

    def describe_paths(self, paths: list[str], scan: Sequence[str] = (), tree: str | None = None,
                       mounted: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        """Each path as this host sees it (``describe_paths`` below), through the host agent by default."""
        lines: list[str] = []
        argv = [self.python, "-m", "flagperf.hosts.agent", *describe_paths_args(paths, scan, tree, mounted)]
        result = self.run(argv, timeout=120, log_path=self.work_root / "commands.log", on_line=lines.append)
        if result.exit_code != 0 or not lines:
            raise OSError(f"host {self.name}: cannot look at {', '.join(paths)} (agent exited {result.exit_code})")
        return dict(json.loads(lines[-1])["paths"])

    def environment(self) -> dict[str, str]:
        env = {**allowed_environment(os.environ), **getattr(self, "extra_env", {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.project_root), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        # Who started the process: a case that finds another parent when it starts (the launcher died while it
        # imported torch) is orphaned already, which its parent watch alone cannot tell (flagperf.entry).
        env[PARENT_PID_ENV] = str(os.getpid())
        # CUDA numbers GPUs fastest-first by default, NVML by PCI bus: make them agree, so a monitor
        # samples exactly the GPUs in CUDA_VISIBLE_DEVICES.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return env



class LocalHost(Host):
    """The controller machine itself: the embedded default, no SSH and no server."""

    def __init__(self, name: str = "localhost", work_root: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        if not NAME_PATTERN.match(name):
            raise ValueError(f"host name {name!r} is not a valid name")
        self.name = name
        self.extra_env = dict(env or {})  # the inventory's env for this host, as for SSH and Docker hosts
        self.project_root = PROJECT_ROOT
        self.python = sys.executable
        self.work_root = (work_root or default_work_root()).resolve()
        self._interrupted_ends: dict[Path, int] = {}  # by log_path: commands run() saw end as it was interrupted

    def __repr__(self) -> str:
        return f"LocalHost({self.name!r})"

    def ended_when_interrupted(self, log_path: Path) -> int | None:
        # read once: a later command at the same log path (a rerun of the round) must not inherit this one's end
        return self._interrupted_ends.pop(log_path, None)

    def run(self, argv: list[str], *, timeout: float, log_path: Path | None = None,
            on_line: LineSink | None = None, pid_file: Path | None = None) -> CommandResult:
        if log_path is not None:  # an end seen of an earlier command at this log path is not this one's
            self._interrupted_ends.pop(log_path, None)
        start = time.monotonic()
        logger.info("starting %s (timeout %.0f s)", shlex.join(argv), timeout)
        log: IO[str] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = log_path.open("a", encoding="utf-8", errors="replace")
        try:
            try:
                proc = subprocess.Popen(argv, cwd=self.project_root, env=self.environment(), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace", start_new_session=True)
            except OSError as exc:
                if log:
                    log.write(f"cannot start {argv[0]}: {exc}\n")
                return CommandResult(argv, None, False, time.monotonic() - start)
            timed_out = False
            try:
                if pid_file is not None:
                    pid_file.write_text(str(proc.pid))
                reader = threading.Thread(target=_pump, args=(proc.stdout, log, on_line), daemon=True)
                reader.start()
                wait_unless_stopped(proc, start + timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc, grace_s=5.0)
            except BaseException:  # interrupted, or we failed: the case must not run on unobserved
                code = _kill_group(proc, grace_s=5.0)
                if code is not None and log_path is not None:  # seen to end: ended_when_interrupted says so
                    self._interrupted_ends[log_path] = code
                raise
            reader.join(timeout=10)
            return CommandResult(argv, proc.returncode, timed_out, time.monotonic() - start)
        finally:
            if log:
                log.close()

    def spawn(self, argv: list[str], *, log_path: Path) -> BackgroundProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(argv, cwd=self.project_root, env=self.environment(), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return BackgroundProcess(argv=argv, pid=proc.pid, handle=proc)

    def terminate(self, proc: BackgroundProcess, grace_s: float = 10.0) -> int | None:
        return _kill_group(proc.handle, grace_s)

    def is_running(self, proc: BackgroundProcess) -> bool:
        return proc.handle.poll() is None

    def write_text(self, path: Path, text: str, mode: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        if mode is None:
            tmp.write_text(text, encoding="utf-8")
        else:
            tmp.unlink(missing_ok=True)  # a new file: created with the mode, never readable by others meanwhile
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w", encoding="utf-8") as out:
                out.write(text)
        tmp.replace(path)

    def fetch_tree(self, remote: Path, local: Path) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for folder, dirs, files in os.walk(remote):  # os.walk does not descend into linked folders
            source_dir = Path(folder)
            target_dir = local / source_dir.relative_to(remote)
            target_dir.mkdir(parents=True, exist_ok=True)
            dirs[:] = [d for d in dirs if not (source_dir / d).is_symlink()]
            for name in files:
                source = source_dir / name
                info = source.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue
                with source.open("rb") as src, (target_dir / name).open("wb") as dst:
                    # The size listed, never more: a file a process still writes to cannot make the copy endless.
                    copy_bytes(src, dst, info.st_size)
                    dst.flush()
                    os.fsync(dst.fileno())
                sizes[str(source.relative_to(remote))] = info.st_size
        return sizes

    def remove_tree(self, remote: Path) -> None:
        shutil.rmtree(remote, ignore_errors=True)

    def remove_if_empty(self, remote: Path) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(remote)

    def exists(self, remote: Path) -> bool:
        return remote.exists()

    def list_folder(self, remote: Path) -> list[str]:
        return os.listdir(remote)

    def read_text(self, remote: Path, max_bytes: int = MAX_RECORD_BYTES) -> str:
        return read_bounded(remote, max_bytes).decode("utf-8", errors="replace")

    def read_end(self, remote: Path, max_bytes: int) -> str:
        text = read_end(remote, max_bytes)
        if text is None:  # missing, unreadable or not a regular file: say which, as open would
            info = remote.stat()  # raises OSError for a missing or unreadable one
            raise ValueError(f"{remote}: not a regular file (mode {stat.filemode(info.st_mode)}); not read")
        return text

    def controller_pid(self) -> int:
        return os.getpid()

    def describe_paths(self, paths: list[str], scan: Sequence[str] = (), tree: str | None = None,
                       mounted: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        return describe_paths(paths, scan, tree, mounted)

    def disk_free(self, path: Path) -> int:
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        return shutil.disk_usage(probe).free


# What a case or a monitor started here inherits from the controller: what a process needs to run and what
# steers the accelerator stack and its libraries; never credentials (PGPASSWORD, PREFECT_API_KEY, cloud keys).
ALLOWED_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
                           "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYENV_VERSION", "PYENV_ROOT"})
ALLOWED_PREFIXES = ("LC_", "PYTHON", "FLAGPERF_", "PREFECT_", "CUDA_", "CUBLAS", "CUDNN_", "NVIDIA_", "NCCL_",
                    "GLOO_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "ORT_", "HIP_",
                    "ROCM_", "ROCR_", "HSA_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "XLA_", "ASCEND_")
SECRET_WORDS = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|PGPASS|AUTH|CREDENTIAL|DATABASE|POSTGRES|HISTORY_URL|"
                          r"_DSN", re.I)
URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]*@")


def allowed_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of an environment (device selectors such as *_VISIBLE_DEVICES included)."""
    return {name: value for name, value in environ.items()
            if (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES) or name.endswith("_VISIBLE_DEVICES"))
            and not SECRET_WORDS.search(name) and not URL_WITH_PASSWORD.search(value)}


def links_leaving(folder: str, limit: int = LINKS_LISTED, tree: str | None = None,
                  mounted: Sequence[str] = (), only: str | None = None, skipped: list[str] | None = None
                  ) -> list[list[str]]:
    """The symlinks below ``folder`` (itself resolved) that a copy of it mounted at another path would not follow:
    one whose target is an absolute path, or whose way leaves the folder (a '..' above it, or a link out). Each as
    [its path below the folder, its target as written, where it leads here], the first ``limit`` the walk meets (a
    folder's names sorted, then what is in its folders; a folder that cannot be listed where the walk tries to
    enter it: not path order). A linked folder is checked as a link, never walked (it may loop). The folders and
    names the source digest skips (a venv, .git, __pycache__, a dot-file: paths.walk_source, the digest's own walk)
    are skipped here too: none of it is the code a round runs; a build output (foo.so) is checked, since a round
    loads it.
    ``tree``: the folder is mounted as part of that tree, at the tree's path as written (the project, mounted at
    project_root): then only the links that leave the tree count, and an absolute target counts unless it names a
    place in the tree by that path. ``mounted``: the container's other mounts (its data mounts, a Slurm entry's
    shared_dir), each SOURCE:TARGET (a host path and where the container has it) or a TARGET the container has
    from the same host path: a link to a place under a target, as the container reads the link, leaves nothing (a
    case's data -> /datasets/imagenet, where /datasets/imagenet is a data mount) where the container resolves it
    there too: every further link on its way (/datasets/imagenet itself a link on the host) must lead to a place the
    container has (resolved_in_container). So must a link whose first hop stays in the folder (or the tree) and
    whose way then leaves it by a further link (shared/ds, itself a link to a data mount): it is followed hop by hop
    as the container reads each, and counts only where one leads out of every place the container has. A name the
    host cannot look at (EACCES: a folder listed but not entered) or a folder it cannot list counts too, with ""
    as its target (no link has an empty one) and the error in place of where it leads (unreadable_reason): whether
    a link there leaves is unknown. The scanned folder itself, where it cannot be listed, is named "." (relpath's
    name of it). ``only``: a part of the folder (engines/onnxruntime) whose links alone are wanted, those on the way
    to it included (and a folder on the way that cannot be listed), each still judged as the folder's (a link to
    elsewhere in the folder stays in): the walk enters nothing else, so ``limit`` is not spent on the rest of the
    folder. A part reached through a link inside the folder (engines -> real_engines) is walked at its real place,
    its findings named as the walk of the whole folder names them; one given with '..' or absolute is a ValueError.
    ``skipped``: the folders the walk passed over by the rule above are added to it (walk_source's), each as its path
    below the folder, once: those it met before it stopped (at ``limit``, or the way to ``only``); so is each dot-file
    passed over that is a link leaving the folder by the rule above (a round passes it unjudged)."""
    root = os.path.realpath(folder)
    if only is not None and (os.path.isabs(only) or ".." in only.split(os.sep)):
        raise ValueError(f"links_leaving: only={only!r} is not a part below the folder (absolute, or with '..')")
    bound = root if tree is None else os.path.realpath(tree)
    at = None if tree is None else os.path.normpath(tree)
    mounts = [view for view in map(mount_view, mounted) if view[1] != "/"]
    views = [*mounts, *([(bound, at)] if at is not None else [])]  # and the tree, as a container has it
    found: list[list[str]] = []
    named: set[str] = set()  # the paths found (a part's way and the part may meet one link twice)

    def unlisted(error: OSError) -> None:  # a folder that cannot be listed: what is in it is unknown
        if isinstance(error, (FileNotFoundError, NotADirectoryError)) or error.filename is None:
            return
        below = os.path.relpath(os.fsdecode(error.filename), root)
        # its own name may have been found already (not entered: lstat of it failed in its parent's listing)
        if len(found) < limit and below not in named:
            named.add(below)
            found.append([below, "", unreadable_reason(error)])

    def judge(path: str) -> list[str] | None:
        """The finding of one name the walk lists, None where it is no link, or one that leaves nothing."""
        # lstat, not os.path.islink: that says False where the folder is listed but cannot be entered (EACCES),
        # and a link there would pass unseen. What cannot be looked at is a finding (its target unknown: "").
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return None
            target = os.readlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone meanwhile
        except OSError as error:
            return [os.path.relpath(path, root), "", unreadable_reason(error)]
        way = os.path.normpath(os.path.join(os.path.dirname(os.path.relpath(path, bound)), target))
        real = os.path.realpath(path)
        # Where the container looks: an absolute target as written; a relative one from the link's place in the
        # container, known where the folder is part of the tree (elsewhere it lies under /flagperf-search).
        # As written ('..' kept): a '..' after a link goes up from where the link leads, not lexically, so the
        # container's way is followed on the raw path (esc/../x, esc a link out of the mounts, leaves them).
        raw = target if os.path.isabs(target) else \
            None if at is None else os.path.join(at, os.path.dirname(os.path.relpath(path, bound)), target)
        there = None if raw is None else os.path.normpath(raw)
        if raw is not None and there is not None and any(_inside(there, place) for _, place in mounts):
            if resolved_in_container(raw, views, hops=LINKS_FOLLOWED - 1):  # the link itself was the first
                return None  # the container has that place mounted: the link leads there as on the host
            leaves = True
        elif os.path.isabs(target):
            leaves = at is None or not _inside(os.path.normpath(target), at)
        else:
            leaves = way == ".." or way.startswith("../")
        if not leaves:
            # Its first hop stays in the folder (or tree); a later link may lead on, out (project/shared/ds ->
            # /datasets/imagenet, where it may land in a mount) or back in by the host's own path of a tree the
            # container has elsewhere (shared/x -> /real/shared/y, project_root /opt a link to /real): followed
            # hop by hop as the container would, every time (where it ends on the host proves nothing).
            leaves = not resolved_in_container(_in_container(path, target, bound, at), [*views, *(
                [(bound, SCANNED_AT)] if at is None else [])], hops=LINKS_FOLLOWED - 1,
                alone=SCANNED_AT if at is None else None)
        return [os.path.relpath(path, root), target, real] if leaves else None

    def scan(steps: Sequence[str]) -> None:
        """The walk of the folder (``steps``: only the way to that part of it, and the part), adding its findings."""
        passed: list[str] = []
        dotted: list[str] = []  # the dot-files passed over that are links
        for top, folders, files in walk_source(root, built=True, onerror=unlisted, skipped=passed,
                                               skipped_links=None if skipped is None else dotted):
            if len(found) >= limit:
                return
            names = sorted([*folders, *files])
            depth = 0 if top == root else len(os.path.relpath(top, root).split(os.sep))
            if skipped is not None:  # on the way to the part, only a step of it (the walk enters nothing else)
                leaving = [path for path in dotted if judge(path) is not None]
                skipped.extend(below for below in (os.path.relpath(path, root) for path in [*passed, *leaving])
                               if below not in skipped and (depth >= len(steps)
                                                            or os.path.basename(below) == steps[depth]))
            passed.clear()
            dotted.clear()
            if depth < len(steps):  # above the part: the next step on the way to it alone (os.walk enters the rest)
                folders[:] = [name for name in folders if name == steps[depth]]
                names = [name for name in names if name == steps[depth]]
            for name in names:
                finding = judge(os.path.join(top, name))
                if finding is not None and finding[0] not in named:
                    named.add(finding[0])
                    found.append(finding)
                    if len(found) >= limit:
                        return

    if only is None:
        scan(())
        return found[:limit]
    # The walk enters no link, so a part reached through one (engines -> real_engines, a link inside the folder) is
    # walked at its real place, under the names the walk of the whole folder gives it; and each link on the way to it
    # is judged where that walk meets it (a link in a folder it does not enter, or outside the folder, it never does).
    links, real_part = _way_through(root, os.path.normpath(only))
    for link in links:
        if _inside(link, root):
            scan(os.path.relpath(link, root).split(os.sep))
    if real_part is not None and _inside(real_part, root):
        scan(() if real_part == root else os.path.relpath(real_part, root).split(os.sep))
    return found[:limit]


def _way_through(root: str, part: str) -> tuple[list[str], str | None]:
    """The links met on the way from ``root`` (real) to ``part`` below it, as the host opens that path, each by its
    path with its folder real (so that a walk of ``root`` finds it there), and the real place reached (None: a loop,
    or a chain longer than Linux follows, reaches nowhere). A name that cannot be looked at is taken as it stands:
    the walk along it says what it cannot list."""
    pending = [name for name in reversed(part.split(os.sep))]
    here, links = root, []
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            here = os.path.dirname(here)
            continue
        path = os.path.join(here, name)
        try:
            target = os.readlink(path) if stat.S_ISLNK(os.lstat(path).st_mode) else None
        except OSError:
            target = None
        if target is None:
            here = path
            continue
        if len(links) >= LINKS_FOLLOWED:
            return list(dict.fromkeys(links)), None
        links.append(path)
        here = "/" if os.path.isabs(target) else here
        pending.extend(reversed(target.split("/")))
    return list(dict.fromkeys(links)), here


def unreadable_reason(error: OSError) -> str:
    """A links_leaving finding's third field where the path could not be looked at (its target ""): the error as
    'ENAME: strerror' (EACCES: Permission denied; EIO: Input/output error), which the controller words the advice by
    (container_policy.leaving_link_words). An agent older than it sent the path there (starting with '/'): an
    older controller reads no field of such a finding but its name, and so refuses it either way."""
    name = errno.errorcode.get(error.errno or 0, "EUNKNOWN")
    return f"{name}: {error.strerror or os.strerror(error.errno or 0)}"


# How many symlinks Linux follows in one path lookup (MAXSYMLINKS) before it fails with ELOOP.
LINKS_FOLLOWED = 40

# Where links_leaving takes a folder mounted alone to lie in a container (its real place, under /flagperf-search, is
# the caller's): as deep as none of those, so a '..' climbing out of it never reaches a mount the real one would not.
SCANNED_AT = "/.flagperf-scanned/1/2/3/4/5/6/7/8"


def _in_container(link: str, target: str, bound: str, at: str | None) -> str:
    """Where ``link`` (below ``bound``, which a container has at ``at``, or at SCANNED_AT) leads as the container
    reads it: an absolute target as written, a relative one from the link's place there ('..' kept)."""
    if os.path.isabs(target):
        return target
    return os.path.join(at or SCANNED_AT, os.path.dirname(os.path.relpath(link, bound)), target)


def mount_view(entry: str) -> tuple[str, str]:
    """A --mounted/--bind entry as (the host folder the container sees there, resolved here; its path in the
    container): SOURCE:TARGET, or a TARGET the container has from the same host path (no mount's path holds a ':')."""
    source, _, target = entry.rpartition(":")
    return os.path.realpath(source or target), mount_target(target)


def mount_target(target: str) -> str:
    """A mount's path in the container, normalised: normpath keeps a leading '//' ('//' is not '/' to POSIX), which
    no folder's path starts with, so a mount at '//' would stand for the container's root yet match no '/' check."""
    return "/" + os.path.normpath(target).lstrip("/")


def resolved_in_container(path: str, views: Sequence[tuple[str, str]], hops: int = LINKS_FOLLOWED,
                          alone: str | None = None) -> bool:
    """Whether ``path`` (absolute, as a container reads it) leads, link by link, only through places the container
    has and ends in one: ``views``, (host folder, its path in the container). Each part is looked up on the host in
    the folder the container has it from, and a link there is followed as the container follows it (an absolute
    target from the container's root); a part outside every view is the image's, not the host's (False), except a
    folder on the way to a mount point, and only on the way: ending there (a '..' up from a mount), the host reads
    the real folder with all it holds, the container an empty one the engine made. ``alone``: the view target that
    stands in for a folder mounted alone (SCANNED_AT): ``path`` starts in it, and a '..' above it, or a way back
    into it by name from above, is refused (the container has it elsewhere); so is a '..' from a mount point whose
    parent the host reads elsewhere (_up_alike). What is not there at the end is not
    there on the host either: not this check's concern."""
    parts = [part for part in path.split("/") if part]
    here = "/"
    if alone is not None and _inside(os.path.normpath(path), alone):  # the walk starts in the stand-in, not above it
        parts, here = parts[len([part for part in alone.split("/") if part]):], alone
    while parts:
        part = parts.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            if alone is not None and here == alone:
                return False  # above the folder mounted alone: the container's parents there are not the host's
            if not _up_alike(here, views):
                return False
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        view = max((v for v in views if _inside(step, v[1])), key=lambda v: len(v[1]), default=None)
        if view is None:
            if any(_inside(target, step) for _, target in views if target != alone):
                here = step  # a folder the engine makes for a mount point below it: a step on the way, never an end
                continue
            return False
        host = view[0] + step[len(view[1]):]
        link = step != view[1] and _is_link(host)  # a mount point itself is the folder its source resolves to
        if link is None:
            return False  # unreadable here: whether the way goes on elsewhere is unknown
        if link:
            hops -= 1
            if hops < 0:
                return False  # a loop
            try:
                target = os.readlink(host)
            except OSError:
                return False
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                here = "/"
            continue
        here = step
    return any(_inside(here, target) for _, target in views)


def _is_link(path: str) -> bool | None:
    """Whether ``path`` is a symlink: False where nothing is there, None where the host cannot tell (EACCES on a
    folder on the way: os.path.islink says False, and the check would read on past a link it never saw)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return None


def _up_alike(here: str, views: Sequence[tuple[str, str]]) -> bool:
    """Whether a '..' from ``here`` (a folder as the container reads it) leads the host, reading the same link, to the
    folder the container's parent stands for. The container goes up lexically from a mount point (or from a folder
    the engine made for one); the host goes up from where that path resolves: /datasets/imagenet, mounted from the
    same path and a link to /nfs/imagenet on the host, has /datasets above it in the container but /nfs on the host,
    so /datasets/imagenet/../coco is /datasets/coco in one and /nfs/coco in the other. Below a mount point the folder
    is a real one in the mount's source (links on the way were followed): its parent is the same in both."""
    if here == "/":
        return True
    source = next((host for host, target in views if target == here), None)
    if source is None:
        if any(_inside(here, target) for _, target in views):
            return True
        source = os.path.realpath(here)  # a folder on the way to a mount point: the host's own, resolved
    return os.path.dirname(source) == os.path.realpath(os.path.dirname(here))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def describe_paths(paths: list[str], scan: Sequence[str] = (), tree: str | None = None,
                   mounted: Sequence[str] = (), limit: int = LINKS_LISTED, only: str | None = None,
                   skipped: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each path with every symlink resolved, and what it then is: folder, file, char-device, socket, other,
    missing (``dangling`` too where the path is a link to nothing) or inaccessible (the container policy checks what a
    mount or device really is on its host); of a folder
    among ``scan`` also its ``links_out`` (links_leaving: a mount of it elsewhere would leave them dangling), of the
    links that leave ``tree`` where it resolves into that tree (the project: a container has the folder as part of
    it), else of those that leave the folder; a link to a place under one of ``mounted`` (the container's other mount
    targets) is none of them. ``limit``: how many such links of a folder, as links_leaving's (vendor check names
    every one; a round's error the first); ``only``: as links_leaving's (vendor check of one engine's folder);
    ``skipped``: as links_leaving's, of each folder scanned (vendor check's one folder; never a round's)."""
    described: dict[str, dict[str, Any]] = {}
    real_tree = os.path.realpath(tree) if tree is not None else None
    for path in paths:
        real = os.path.realpath(path)
        try:
            mode = os.stat(real).st_mode
        except FileNotFoundError:
            kind = "missing"
        except OSError:
            kind = "inaccessible"
        else:
            kind = ("folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else
                    "char-device" if stat.S_ISCHR(mode) else "socket" if stat.S_ISSOCK(mode) else "other")
        described[path] = {"path": real, "kind": kind}
        if kind == "missing" and os.path.islink(path):  # a file that is a dangling link still counts as there
            described[path]["dangling"] = True
        if path in scan and kind == "folder":
            within = real_tree is not None and _inside(real, real_tree)
            described[path]["links_out"] = links_leaving(real, limit, tree=tree if within else None,
                                                           mounted=mounted, only=only, skipped=skipped)
            loops = [below for below, _, _ in described[path]["links_out"] if _loops(os.path.join(real, below))]
            if loops:  # a key of its own: an older controller reads the rest as before
                described[path]["loops"] = loops
    return described


def _loops(link: str) -> bool:
    """Whether opening ``link`` fails with ELOOP: a loop of links, or a chain longer than the kernel follows."""
    try:
        os.stat(link)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def describe_paths_args(paths: Sequence[str], scan: Sequence[str] = (), tree: str | None = None,
                        mounted: Sequence[str] = ()) -> list[str]:
    """The host agent's describe-paths command for describe_paths' arguments: an option only where it is given, so
    that a deployment older than an option still answers where it is not needed. A mount from the same host path
    (every data mount) goes as --mounted=TARGET, which every agent reads so; a SOURCE:TARGET pair as --bind, which an
    agent older than it refuses in argparse (an older --mounted would take the pair for one path)."""
    options = []
    for entry in mounted:
        source, _, target = entry.rpartition(":")
        same = not source or os.path.normpath(source) == os.path.normpath(target)
        options.append(f"--mounted={target}" if same else f"--bind={source}:{target}")
    return ["describe-paths", *(f"--scan={folder}" for folder in scan), *([f"--tree={tree}"] if tree else []),
            *options, "--", *paths]


def default_work_root() -> Path:
    """FLAGPERF_WORK_ROOT, else a folder of this user's own in the temp dir (0700: jobs and results
    pass through it, and another user must not be able to plant or read them)."""
    configured = os.environ.get("FLAGPERF_WORK_ROOT")
    if configured:
        return Path(configured)
    root = Path(tempfile.gettempdir()) / f"flagperf-work-{os.getuid()}"
    problem = private_folder_problem(root)
    if problem:
        raise PermissionError(f"{root} is not a private folder of this user ({problem}); set FLAGPERF_WORK_ROOT")
    return root


def private_folder_problem(root: Path, strict: bool = True) -> str | None:
    """Make ``root`` (0700) if missing; then why it is not this user's own folder, or None. ``strict``: nobody
    else may even read it (a folder in a shared temp dir); else nobody else may write to it."""
    try:
        root.mkdir(mode=0o700, parents=not strict, exist_ok=True)
        info = root.lstat()
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "not a folder (a link?)"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not {os.getuid()}"
    if info.st_mode & (0o077 if strict else 0o022):
        return f"mode {stat.S_IMODE(info.st_mode):o}"
    return None


def copy_bytes(src: IO[bytes], dst: IO[bytes], count: int, chunk: int = 1 << 20) -> None:
    """Copy at most ``count`` bytes from ``src`` to ``dst``."""
    while count > 0:
        data = src.read(min(chunk, count))
        if not data:
            return
        dst.write(data)
        count -= len(data)


STOP_POLL_S = 0.5  # how often a command's wait looks whether the evaluation is stopping


def wait_unless_stopped(proc: subprocess.Popen[str], deadline: float) -> None:
    """Wait for ``proc`` until the monotonic ``deadline`` (TimeoutExpired then); RoundsStopped as soon as the
    evaluation is stopping (an interrupt): the case runs in its own session, so a Ctrl-C never reaches it, and the
    thread that waits on it must end before the controller cleans the host."""
    while True:
        try:
            proc.wait(timeout=max(0.0, min(STOP_POLL_S, deadline - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            if stop_requested():
                raise RoundsStopped(f"the run is stopping: {proc.args[0]} was ended") from None


def _pump(stream: IO[str] | None, log: IO[str] | None, on_line: LineSink | None) -> None:
    if stream is None:
        return
    for line in stream:
        if log:
            log.write(line)
            log.flush()
        if on_line:
            on_line(line.rstrip("\n"))


def _kill_group(proc: subprocess.Popen[Any], grace_s: float) -> int | None:
    """SIGTERM the process group, then SIGKILL after ``grace_s``: children never outlive a round."""
    if proc.poll() is not None:
        return proc.returncode
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()

"""A host reached over SSH (paramiko): commands through ``python -m flagperf.hosts.agent`` on the host, files
through SFTP. Host keys are verified against known_hosts; a new key is accepted only when the inventory
says so, a changed key never. Every connect and command has a timeout.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import posixpath
import re
import shlex
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import paramiko

from flagperf.hosts.agent import STATUS_PREFIX
from flagperf.hosts.inventory import HostSpec
from flagperf.hosts.local import BackgroundProcess, CommandResult, Host, LineSink, copy_bytes, describe_paths_args
from flagperf.paths import PROJECT_ROOT
from flagperf.results.bounded import MAX_RECORD_BYTES

logger = logging.getLogger("flagperf.hosts.ssh")
# A case's own timeout is enforced on the host by the agent; the connection gets this much more before the
# controller gives up on it (and closing the channel makes the agent kill the case).
CHANNEL_SLACK_S = 60.0
# What the controller holds of a command's output at most: a line handed on (longer lines go in pieces), and
# the tail of stderr (where the agent's status line is).
MAX_LINE_BYTES = 1 << 20
STDERR_TAIL = 1 << 16
DEFAULT_PYTHON = "python3"
# A failed write where the host's file system has less than the file plus this free is put down to a full disk.
FULL_SLACK_BYTES = 64 * 1024
NO_EXIT_STATUS = -1  # paramiko's exit status of a channel closed without one (the session went away)


class SshError(OSError):
    """The host cannot be reached, authenticated, or did not answer: one line naming the host and cause."""


ARGPARSE_EXIT = 2  # argparse's exit status for a command line it refuses
# argparse's last line for an option (or a command) the host agent does not know: one the controller's version has.
UNKNOWN_ARGUMENTS = re.compile(r"error: (?:unrecognized arguments: (?P<options>.*)|argument command: invalid "
                               r"choice: '(?P<command>[\w-]+)')")


def older_agent(command: str, detail: str) -> str | None:
    """What the host agent said it does not know of ``command`` (its options by name: a path after '=' stays out of
    the message), where ``detail`` (its last line of stderr) is argparse's complaint; else None."""
    found = UNKNOWN_ARGUMENTS.search(detail)
    if found is None:
        return None
    if found.group("command"):
        return f"has no command {found.group('command')}"
    options = list(dict.fromkeys(word.split("=", 1)[0] for word in found.group("options").split()
                                 if word.startswith("--")))
    return f"{command} does not know {', '.join(options) or 'an argument it was given'}"


class _RecordNewKey(paramiko.MissingHostKeyPolicy):
    """accept_new_host_key: trust a key seen for the first time and write it to known_hosts (like
    OpenSSH's StrictHostKeyChecking=accept-new). A *changed* key is refused by paramiko before this."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a", encoding="utf-8") as out:
            out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        logger.warning("accepted new host key for %s (%s %s) into %s", hostname, key.get_name(),
                       key.fingerprint, self.known_hosts)


class _RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise SshError(f"unknown host key for {hostname} ({key.get_name()} {key.fingerprint}): not in "
                       f"{self.known_hosts}; check it and add it (ssh-keyscan), or set accept_new_host_key: true")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class SshHost(Host):
    def __init__(self, spec: HostSpec) -> None:
        spec = spec.with_ssh_config()
        self.spec = spec
        self.name = spec.name
        self.address = spec.address
        self.project_root = Path(spec.project_root or PROJECT_ROOT)
        self.python = spec.python or DEFAULT_PYTHON
        self.work_root = Path(spec.work_root or f"/tmp/flagperf-work-{spec.ssh_user()}")
        self.shared_tmp_work_root = spec.work_root is None  # in /tmp: nobody else may even read it
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._keepalive: tuple[paramiko.Channel, int] | None = None
        self._closed = False  # close() is final: a thread still driving the host must not reconnect behind it

    def __repr__(self) -> str:
        return f"SshHost({self.name!r}, {self.spec.ssh_user()}@{self.address}:{self.spec.port})"

    def __getstate__(self) -> dict[str, Any]:
        # Prefect hashes and may copy task arguments: a connection is not part of a host's identity.
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])  # type: ignore[misc]

    # ------------------------------------------------------------------ connection

    def where(self) -> str:
        return f"{self.spec.ssh_user()}@{self.address}:{self.spec.port}"

    def client(self) -> paramiko.SSHClient:
        with self._lock:
            if self._closed:
                raise SshError(f"host {self.name}: its connection was closed (the run is stopping or has ended); "
                               "not connecting again")
            transport = self._client.get_transport() if self._client else None
            if self._client is not None and transport is not None and transport.is_active():
                return self._client
            self._client = self._connect()
            return self._client

    def _connect(self) -> paramiko.SSHClient:
        spec = self.spec
        known_hosts = spec.known_hosts.expanduser()
        client = paramiko.SSHClient()
        if known_hosts.is_file():
            client.load_host_keys(str(known_hosts))
        policy = _RecordNewKey(known_hosts) if spec.accept_new_host_key else _RefuseUnknownKey(known_hosts)
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(
                spec.address, port=spec.port or 22, username=spec.ssh_user(),
                key_filename=str(spec.key_file) if spec.key_file else None,
                allow_agent=spec.key_file is None, look_for_keys=spec.key_file is None,
                timeout=spec.connect_timeout_s, banner_timeout=spec.connect_timeout_s,
                auth_timeout=spec.connect_timeout_s, channel_timeout=spec.connect_timeout_s,
            )
        except SshError as exc:
            raise SshError(f"host {self.name}: {exc}") from None
        except paramiko.BadHostKeyException as exc:
            raise SshError(f"host {self.name}: host key CHANGED for {self.where()} (got {exc.key.get_name()} "
                           f"{exc.key.fingerprint}, {known_hosts} has {exc.expected_key.fingerprint}); refusing to "
                           "connect: if the host was reinstalled, remove the old key") from None
        except paramiko.AuthenticationException as exc:
            raise SshError(f"host {self.name}: authentication failed for {self.where()}: {exc}") from None
        except TimeoutError:
            raise SshError(f"host {self.name}: no answer from {self.where()} within "
                           f"{spec.connect_timeout_s:.0f} s (connect_timeout_s)") from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:  # its own text starts "[Errno None] ..."
            why = "; ".join(sorted({error.strerror or str(error) for error in exc.errors.values()}))
            raise SshError(f"host {self.name}: cannot connect to {self.where()}: {why or exc}") from None
        except (OSError, paramiko.SSHException) as exc:
            raise SshError(f"host {self.name}: cannot connect to {self.where()}: {exc}") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        logger.info("connected to %s (%s)", self.name, self.where())
        return client

    def close(self) -> None:
        """End the connection and every command on it (the host's agent stops what a closed channel ran); final:
        every later call is an SshError, never a new connection (open_host gives a new SshHost for new work)."""
        with self._lock:
            self._closed = True
            if self._keepalive is not None:
                self._keepalive[0].close()
                self._keepalive = None
            if self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------------ commands

    def remote_environment(self) -> dict[str, str]:
        """What every command's line sets: plumbing only. The inventory's variables (their values may be secrets)
        never go on a command line, which anyone on the host can read in ``ps``: see inventory_env_input."""
        return {"PYTHONPATH": str(self.project_root), "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def command_line(self, argv: list[str]) -> str:
        """One quoted shell line: every piece from a config goes through shlex.quote; no value of the inventory."""
        assignments = [f"{k}={v}" for k, v in self.remote_environment().items()]
        return f"cd {shlex.quote(str(self.project_root))} && exec " + shlex.join(["env", *assignments, *argv])

    def agent(self, *args: str) -> list[str]:
        return [self.python, "-m", "flagperf.hosts.agent", *args]

    def inventory_env_input(self) -> tuple[list[str], str | None]:
        """The agent option and the first line of its stdin that give a case the inventory's variables: their
        values go through the SSH channel's stdin (readable by nobody else on the host), never on the command
        line or in the agent's own environment."""
        env = self.spec.runtime_env()
        return (["--inventory-env-stdin"], json.dumps(env) + "\n") if env else ([], None)

    def execute(self, argv: list[str], timeout: float | None = None, on_stdout: LineSink | None = None,
                keep_stdin_open: bool = False, stdin_text: str | None = None) -> tuple[int | None, str, str]:
        """Run argv on the host; returns (exit status or None on timeout, stdout, stderr). With ``on_stdout``
        the output is handed on line by line as it arrives and not kept (a round's output may be any size:
        the host agent writes it to the round's log file there); stderr keeps its last STDERR_TAIL bytes.
        ``stdin_text`` is sent first (secrets for the agent: a channel is private, a command line is not)."""
        limit = timeout if timeout is not None else self.spec.command_timeout_s
        channel = self.client().get_transport().open_session(timeout=self.spec.connect_timeout_s)  # type: ignore[union-attr]
        channel.settimeout(1.0)
        stdout = bytearray()
        stderr = bytearray()
        pending = bytearray()

        def text(data: bytearray) -> str:
            return data.decode("utf-8", "replace")

        try:
            channel.exec_command(self.command_line(argv))
            if stdin_text is not None:
                channel.sendall(stdin_text.encode("utf-8"))
            if not keep_stdin_open:
                channel.shutdown_write()
            deadline = time.monotonic() + limit
            while True:
                if channel.recv_ready():
                    chunk = channel.recv(65536)
                    if on_stdout is None:
                        stdout += chunk
                        continue
                    pending += chunk
                    *lines, rest = pending.split(b"\n")
                    pending = bytearray(rest)
                    for line in lines:
                        on_stdout(line.decode("utf-8", "replace"))
                    while len(pending) > MAX_LINE_BYTES:  # a line without end: handed on in pieces
                        on_stdout(pending[:MAX_LINE_BYTES].decode("utf-8", "replace"))
                        del pending[:MAX_LINE_BYTES]
                    continue
                if channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(65536)
                    del stderr[:-STDERR_TAIL]  # the agent's status is its last line
                    continue
                if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    return None, text(stdout), text(stderr)
                time.sleep(0.02)
            if on_stdout is not None and pending:
                on_stdout(pending.decode("utf-8", "replace"))
            return channel.recv_exit_status(), text(stdout), text(stderr)
        finally:
            channel.close()  # the agent sees stdin close and stops whatever it still runs

    def _agent_json(self, *args: str, stdin_text: str | None = None) -> dict[str, Any]:
        code, out, err = self.execute(self.agent(*args), stdin_text=stdin_text)
        if code != 0:
            detail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
            older = older_agent(args[0], detail) if code == ARGPARSE_EXIT else None
            if older is not None:  # argparse's own complaint: the host's agent predates what the controller asks
                raise SshError(f"host {self.name}: its deployment at project_root {self.project_root} is older than "
                               f"the controller's (its flagperf.hosts.agent {older}): update "
                               f"it, copying the controller's version of the project to {self.project_root} on "
                               f"{self.name} as it was deployed (docs/hosts.md, project_root)")
            how = "timed out" if code is None else f"exited {code}"
            raise SshError(f"host {self.name}: flagperf.hosts.agent {args[0]} {how}: {detail}")
        return json.loads(out.strip().splitlines()[-1])

    def run(self, argv: list[str], *, timeout: float, log_path: Path | None = None,
            on_line: LineSink | None = None, pid_file: Path | None = None) -> CommandResult:
        start = time.monotonic()
        logger.info("starting on %s: %s (timeout %.0f s)", self.name, shlex.join(argv), timeout)
        log = log_path or self.work_root / "commands.log"
        env_option, env_line = self.inventory_env_input()
        args = ["run", "--timeout", str(timeout), "--log", str(log), *env_option]
        if pid_file is not None:
            args += ["--pid-file", str(pid_file)]
        try:
            code, _, err = self.execute(self.agent(*args, "--", *argv), timeout=timeout + CHANNEL_SLACK_S,
                                        on_stdout=on_line, keep_stdin_open=True, stdin_text=env_line)
        except SshError:
            raise
        except (OSError, paramiko.SSHException) as exc:
            raise SshError(f"host {self.name}: connection lost during {argv[0]}: {exc}") from None
        seconds = time.monotonic() - start
        if code is None:  # the host stopped answering: the channel is closed, the agent kills the command
            return CommandResult(argv, None, True, seconds)
        status = next((json.loads(line.removeprefix(STATUS_PREFIX)) for line in reversed(err.splitlines())
                       if line.startswith(STATUS_PREFIX)), None)
        if status is None and code == NO_EXIT_STATUS:
            raise SshError(f"host {self.name}: the SSH session ended before {argv[0]} did, with no exit status "
                           f"(the connection dropped, or the host or its sshd went down) after {seconds:.0f} s: "
                           f"{(err.strip().splitlines() or ['no output'])[-1]}")
        if status is None:
            raise SshError(f"host {self.name}: flagperf.hosts.agent exited {code} without a status: "
                           f"{(err.strip().splitlines() or ['no output'])[-1]}")
        return CommandResult(argv, status["exit_code"], bool(status["timed_out"]), seconds)

    def spawn(self, argv: list[str], *, log_path: Path) -> BackgroundProcess:
        env_option, env_line = self.inventory_env_input()
        answer = self._agent_json("spawn", "--log", str(log_path), *env_option, "--", *argv, stdin_text=env_line)
        return BackgroundProcess(argv=argv, pid=int(answer["pid"]))

    def terminate(self, proc: BackgroundProcess, grace_s: float = 10.0) -> int | None:
        answer = self._agent_json("terminate", "--pid", str(proc.pid), "--grace", str(grace_s))
        return answer.get("exit_code")

    def is_running(self, proc: BackgroundProcess) -> bool:
        code, _, _ = self.execute(self.agent("alive", "--pid", str(proc.pid)))
        return code == 0

    def controller_pid(self) -> int:
        """A keepalive process on the host, alive as long as this connection: monitors follow it."""
        with self._lock:
            if self._keepalive is not None and not self._keepalive[0].closed \
                    and not self._keepalive[0].exit_status_ready():
                return self._keepalive[1]
        channel = self.client().get_transport().open_session(timeout=self.spec.connect_timeout_s)  # type: ignore[union-attr]
        channel.exec_command(self.command_line(self.agent("keepalive")))
        channel.settimeout(self.spec.command_timeout_s)
        line = channel.makefile("r").readline()
        pid = int(json.loads(line)["pid"])
        with self._lock:
            self._keepalive = (channel, pid)
        return pid

    def disk_free(self, path: Path) -> int:
        return int(self._agent_json("disk-free", str(path))["free"])

    def work_root_problem(self) -> str | None:
        """Why the work root is not the SSH user's own folder (made 0700 if missing), or None: checked as the
        local one is, since jobs and results pass through it."""
        args = ["work-root", str(self.work_root)] + (["--strict"] if self.shared_tmp_work_root else [])
        return self._agent_json(*args).get("problem")

    def info(self) -> dict[str, Any]:
        return self._agent_json("info")

    def describe_paths(self, paths: list[str], scan: Sequence[str] = (), tree: str | None = None,
                       mounted: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        return dict(self._agent_json(*describe_paths_args(paths, scan, tree, mounted))["paths"])

    def clock(self) -> float:
        return float(self.info()["time"])

    # ------------------------------------------------------------------ files (SFTP)

    def _sftp(self) -> paramiko.SFTPClient:
        sftp = self.client().open_sftp()
        sftp.get_channel().settimeout(self.spec.command_timeout_s)  # type: ignore[union-attr]
        return sftp

    def _makedirs(self, sftp: paramiko.SFTPClient, folder: PurePosixPath) -> None:
        missing: list[PurePosixPath] = []
        while True:
            try:
                sftp.stat(str(folder))
                break
            except FileNotFoundError:
                missing.append(folder)
                folder = folder.parent
        for item in reversed(missing):
            sftp.mkdir(str(item), mode=0o700)

    def write_text(self, path: Path, text: str, mode: int | None = None) -> None:
        """``path`` on the host holds ``text`` whole, or is as it was: the text goes to a temporary file renamed
        over it. A write that fails (the host's disk is full, the link dropped) removes the temporary file and is
        an SshError of one line naming the host, the file and the cause."""
        remote = PurePosixPath(path)
        data = text.encode("utf-8")
        tmp = str(remote.with_name(f".{remote.name}.tmp"))
        try:
            with self._sftp() as sftp:
                self._makedirs(sftp, remote.parent)
                try:
                    with sftp.open(tmp, "w") as out:
                        if mode is not None:  # before a byte of it is written
                            out.chmod(mode)
                        out.write(data)  # pipelined: a failed write may only show when the file is closed
                    sftp.posix_rename(tmp, str(remote))
                except BaseException:
                    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                        sftp.remove(tmp)  # never a half file left behind on the host
                    raise
        except SshError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._write_error(remote, len(data), exc) from None

    def _write_error(self, remote: PurePosixPath, size: int, exc: BaseException) -> SshError:
        """The SshError for a failed write: SFTP says only "Failure" for a full disk, so the host's free space is
        asked for and the cause named when it is that (errno ENOSPC then, as a local write's)."""
        cause = (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
        try:
            free: int | None = self.disk_free(Path(remote.parent))
        except (OSError, ValueError, paramiko.SSHException, EOFError):
            free = None
        full = free is not None and free < size + FULL_SLACK_BYTES
        if full:
            cause = f"{os.strerror(errno.ENOSPC)} ({free} bytes free there, {size} needed)"
        error = SshError(f"host {self.name}: cannot write {remote}: {cause}")
        if full:
            error.errno = errno.ENOSPC
        return error

    def read_text(self, remote: Path, max_bytes: int = MAX_RECORD_BYTES) -> str:
        with self._sftp() as sftp, self._open_regular(sftp, remote) as handle:
            data = handle.read(max_bytes + 1)  # never more: a file that grows without end is cut, not held
        if len(data) > max_bytes:
            raise ValueError(f"{self.name}:{remote}: more than {max_bytes} bytes; not read")
        return data.decode("utf-8", "replace")

    def read_end(self, remote: Path, max_bytes: int) -> str:
        with self._sftp() as sftp, self._open_regular(sftp, remote) as handle:
            handle.seek(max(0, int(handle.stat().st_size or 0) - max_bytes))
            return handle.read(max_bytes).decode("utf-8", "replace")

    def _open_regular(self, sftp: paramiko.SFTPClient, remote: Path) -> paramiko.SFTPFile:
        """``remote`` opened to read, checked to be a regular file first (the host's sftp-server would wait on a
        FIFO's writer) and again once open (it may have changed since); ValueError when it is not."""
        if not stat.S_ISREG(sftp.stat(str(remote)).st_mode or 0):
            raise ValueError(f"{self.name}:{remote}: not a regular file; not read")
        handle = sftp.open(str(remote), "r")
        if not stat.S_ISREG(handle.stat().st_mode or 0):
            handle.close()
            raise ValueError(f"{self.name}:{remote}: not a regular file; not read")
        return handle

    def exists(self, remote: Path) -> bool:
        with self._sftp() as sftp:
            try:
                sftp.stat(str(remote))
            except FileNotFoundError:
                return False
            return True

    def list_folder(self, remote: Path) -> list[str]:
        with self._sftp() as sftp:
            return list(sftp.listdir(str(remote)))

    def fetch_tree(self, remote: Path, local: Path) -> dict[str, int]:
        try:
            return self._fetch_tree(remote, local)
        except SshError:
            raise
        except (paramiko.SSHException, EOFError) as exc:  # not OSErrors: a dropped link must not read as a bug
            raise SshError(f"host {self.name}: connection lost while copying {remote}: "
                           f"{exc or type(exc).__name__}") from None

    def _fetch_tree(self, remote: Path, local: Path) -> dict[str, int]:
        sizes: dict[str, int] = {}
        with self._sftp() as sftp:
            stack = [(str(remote), local)]
            while stack:
                folder, target = stack.pop()
                target.mkdir(parents=True, exist_ok=True)
                for entry in sftp.listdir_attr(folder):  # lstat-like: links are S_ISLNK, never followed
                    source = posixpath.join(folder, entry.filename)
                    mode = entry.st_mode or 0
                    if stat.S_ISDIR(mode):
                        stack.append((source, target / entry.filename))
                    elif stat.S_ISREG(mode):
                        with (target / entry.filename).open("wb") as dst:
                            _copy_listed_size(sftp, source, dst, int(entry.st_size or 0))
                            dst.flush()
                            os.fsync(dst.fileno())
                        sizes[posixpath.relpath(source, str(remote))] = int(entry.st_size or 0)
        return sizes

    def remove_tree(self, remote: Path) -> None:
        if str(remote) in ("", "/") or not PurePosixPath(remote).is_relative_to(self.work_root):
            raise ValueError(f"refusing to remove {remote} on {self.name}: outside the work root {self.work_root}")
        self.execute(["rm", "-rf", "--", str(remote)])

    def remove_if_empty(self, remote: Path) -> None:
        if PurePosixPath(remote).is_relative_to(self.work_root) and PurePosixPath(remote) != self.work_root:
            self.execute(["rmdir", "--", str(remote)])  # fails, harmlessly, where another run's files are in it


def _copy_listed_size(sftp: paramiko.SFTPClient, source: str, dst: Any, size: int) -> None:
    """Copy the first ``size`` bytes of ``source`` (its size when listed), never more: sftp.getfo reads to the
    end, which a file a process still writes to never reaches."""
    with sftp.open(source, "rb") as src:
        src.prefetch(size)
        copy_bytes(src, dst, size)

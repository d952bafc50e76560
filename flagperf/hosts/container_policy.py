"""What a benchmark container may get from its host: an allow-list of what a benchmark needs, not a deny-list
of what it must not have (docs/hosts-and-containers.md says the same for users).

Mounts (an inventory's docker.data_mounts, -v in docker.extra_options or FlagPerf's ACCE_CONTAINER_OPT):
  * an absolute host path without '..', under a data root: one of DATA_ROOTS, or one the inventory adds in
    docker.data_roots. A data root is never the file system's root, a system folder (SYSTEM_FOLDERS) or a
    folder under one, /home or a home folder itself; no part of a mount or a root is a credentials folder
    (.ssh, .gnupg, ...). So /root/.ssh, /home/<user>/.ssh, /usr/bin, /var/lib/kubelet are not allowed.
  * checked as written when the inventory is loaded, and again before a container starts with every symlink
    resolved on the host whose engine mounts it (a link in /data to /etc is refused); the resolved path is
    what is mounted, and it must be a folder or a regular file (never a socket or a device).
  * read-only, unless the inventory writes ``rw`` for that mount (PATH:rw, -v SRC:DST:rw).
Vendor and case folders outside the host's project (FLAGPERF_VENDOR_PATH's <folder>/<vendor>, FLAGPERF_CASE_PATH's
  <folder>/<family>/<case>; outside as the host resolves the folder, however it is written, as the source digest
  decides): the run's vendor's and cases' folders only, read-only, under a folder of flagperf's own
  (SEARCH_MOUNT_ROOT/<vendor|case>/<index>/<name...>, never at the host's path, where the image may have its own
  files), and the container's variable names those folders instead; resolved on the host, each must stay inside its
  search path folder (a link to elsewhere is refused), with no credentials folder in its path, and no link in it may
  leave it. Those inside the project (its own vendor_images/ and cases/, a variable's folder in it) come with the
  project, mounted whole at project_root: no link in them may leave the project. A link to a place under one of the
  container's other mounts (a data mount, a -v's target; Slurm's shared_dir and container_mounts) leaves nothing, in
  either; what the source digest skips (paths.walk_source: a venv, node_modules, caches) is not looked at, nor is a
  name in a folder the round never reads it from (an earlier place on the search path has it: of a vendor,
  a folder with a vendor.yaml shadows a later one with its own, and a folder without one, which only adds engines,
  is read wherever it lies). Docker hosts and
  Slurm container images get them alike (search_mounts).
Devices (--device, vendor.yaml container.devices): accelerator and RDMA device files by pattern
(DEVICE_PATTERNS: InfiniBand/RoCE, which no vendor owns) plus the patterns the vendor folders declare in
vendor.yaml container.device_patterns (an accelerator's own files: the nvidia folder's /dev/nvidia*, ...);
checked as written and again resolved on the host (a character device, or one of the device folders the
patterns name).
docker-run options: only those FlagPerf's vendors use (--gpus, --device, -e, -v, --ipc, --group-add);
--privileged only from a vendor file that says why.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from flagperf.errors import printable
from flagperf.paths import (
    CASE_FOLDER,
    CASE_MANIFEST,
    CASE_PATH_ENV,
    INFERENCE_CASE_FILE,
    INFERENCE_FAMILY,
    VENDOR_FOLDER,
    VENDOR_PATH_ENV,
)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would let a trailing newline through
# Where benchmark data, weights and results folders usually live on accelerator hosts.
DATA_ROOTS = ("/data", "/datasets", "/dataset", "/models", "/mnt", "/raid", "/scratch", "/nfs", "/share")
# Never a data root, nor any folder under them: the OS, its state and sockets, root's home, shared temp space.
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run",
                  "/sbin", "/snap", "/sys", "/tmp", "/usr", "/var")
HOMES = "/home"  # /home/<user>/<folder> may be a data root; /home and /home/<user> may not
# Folder (and file) names that hold credentials: no mount or data root has one in its path.
CREDENTIAL_NAMES = frozenset({".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config", ".gcloud",
                              ".netrc", ".pgpass", ".git-credentials", ".password-store", ".vault-token"})
# Device files a benchmark needs whatever the accelerator: a segment's * never crosses a '/'. An accelerator's
# own device files are its vendor folder's to declare (vendor.yaml container.device_patterns), not the core's.
DEVICE_PATTERNS = (
    "/dev/infiniband", "/dev/infiniband/*",  # RDMA: InfiniBand / RoCE verbs
)
GPUS = re.compile(r"all|\d{1,3}|device=[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*")
VOLUME_OPTIONS = {"ro", "rw", "z", "Z", "shared", "slave", "private", "rshared", "rslave", "rprivate", "nocopy",
                  "consistent", "cached", "delegated"}


class PolicyError(ValueError):
    """A mount, device or option the policy does not allow: the message is one line saying which and why;
    ``key`` the setting it came from, where the raiser knows it (docker.data_mounts.0, ...), and ``source`` the
    file when it is not the inventory (a vendor.yaml)."""

    def __init__(self, message: str, key: str | None = None, source: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.source = source


@dataclass(frozen=True)
class Mount:
    """A bind mount as the container gets it."""

    source: str
    target: str
    read_only: bool
    options: tuple[str, ...] = ()  # docker volume options besides ro/rw (z, rshared, ...)

    def volume(self) -> str:
        """docker's -v form, with the access mode always explicit."""
        return f"{self.source}:{self.target}:{','.join(('ro' if self.read_only else 'rw', *self.options))}"


@dataclass
class ContainerExtras:
    """docker run options from FlagPerf's ACCE_CONTAINER_OPT, parsed (never passed to a shell)."""

    gpus: str | None = None
    devices: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    ipc: str | None = None
    group_add: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PathFacts:
    """A host path as the host sees it: every symlink resolved, and what it is there; of a folder it was asked to
    scan, the links in it that leave it ([below it, target as written, where it leads], local.links_leaving)."""

    path: str
    kind: str  # folder, file, char-device, socket, other, missing
    links_out: tuple[tuple[str, str, str], ...] = ()
    dangling: bool = False  # missing, but a link is there (a vendor.yaml that is one still makes a vendor's folder)
    loops: tuple[str, ...] = ()  # of links_out, those that end in a loop of links (ELOOP): no place to name

    @property
    def present(self) -> bool:
        """Something is at the path, a dangling link included (flagperf.config.files.is_present's rule)."""
        return self.kind != "missing" or self.dangling

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> PathFacts:
        """The facts from a host's answer (describe_paths: JSON; a deployment older than ``dangling`` sends none)."""
        return cls(path=found["path"], kind=found["kind"],
                   links_out=tuple((str(below), str(target), str(real))
                                   for below, target, real in found.get("links_out", ())),
                   dangling=bool(found.get("dangling", False)),
                   loops=tuple(str(below) for below in found.get("loops", ())))


# ------------------------------------------------------------------------------------------------ paths

def clean_path(path: str, what: str) -> str:
    """An absolute path without '..' or control characters, with '.' parts and repeated slashes dropped."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):  # a NUL or a newline: no path a mount can name
        raise PolicyError(f"{what} {path!r} holds a control character")
    if not path.startswith("/") or any(part == ".." for part in path.split("/")):
        raise PolicyError(f"{what} {path!r} must be an absolute path without '..'")
    return "/" + "/".join(part for part in path.split("/") if part not in ("", "."))


def is_under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


def credentials_in(path: str) -> str | None:
    return next((part for part in path.split("/") if part in CREDENTIAL_NAMES), None)


def data_root_problem(root: str) -> str | None:
    """Why a folder cannot be a data root, or None."""
    if root == "/":
        return "the file system's root"
    system = next((folder for folder in SYSTEM_FOLDERS if is_under(root, folder)), None)
    if system is not None:
        return f"under the system folder {system}" if root != system else "a system folder"
    if root == HOMES or (is_under(root, HOMES) and root.count("/") == 2):
        return "/home or a home folder itself (name a folder inside it)"
    credentials = credentials_in(root)
    if credentials is not None:
        return f"a credentials folder ({credentials})"
    return None


def check_data_roots(roots: Iterable[str]) -> list[str]:
    """An inventory's docker.data_roots: each an absolute folder that may be a data root."""
    checked = []
    for root in roots:
        path = clean_path(root, "data root")
        problem = data_root_problem(path)
        if problem:
            raise PolicyError(f"data root {root!r} is refused: {problem}")
        checked.append(path)
    return checked


def allowed_roots(extra: Iterable[str] = ()) -> tuple[str, ...]:
    return (*DATA_ROOTS, *extra)


def mount_source_problem(source: str, roots: Iterable[str]) -> str | None:
    """Why a (clean) host path may not be mounted, or None."""
    credentials = credentials_in(source)
    if credentials is not None:
        return f"it is in a credentials folder ({credentials})"
    if not any(is_under(source, root) and data_root_problem(root) is None for root in roots):
        return (f"it is outside the data roots ({', '.join(roots)}; an inventory adds one in "
                "docker.data_roots)")
    return None


def check_mount_source(source: str, roots: Iterable[str], what: str) -> str:
    path = clean_path(source, what)
    problem = mount_source_problem(path, tuple(roots))
    if problem:
        raise PolicyError(f"{what} {source!r} is refused: {problem}")
    return path


def parse_data_mount(entry: str, roots: Iterable[str]) -> Mount:
    """A docker.data_mounts entry: PATH (read-only) or PATH:ro / PATH:rw, mounted at the same path."""
    path, colon, mode = entry.partition(":")
    if colon and mode not in ("ro", "rw"):
        raise PolicyError(f"data mount {entry!r}: expected PATH, PATH:ro or PATH:rw")
    source = check_mount_source(path, roots, "data mount")
    return Mount(source, source, read_only=mode != "rw")


def parse_volume(value: str, roots: Iterable[str]) -> Mount:
    """-v SRC:DST[:OPTS]: SRC under a data root, read-only unless OPTS has rw."""
    parts = value.split(":")
    if len(parts) not in (2, 3):
        raise PolicyError(f"-v {value!r}: expected HOST_PATH:CONTAINER_PATH[:ro|rw]")
    source = check_mount_source(parts[0], roots, "-v host path")
    target = clean_path(parts[1], "-v container path")
    options = parts[2].split(",") if len(parts) == 3 else []
    if not set(options) <= VOLUME_OPTIONS:
        raise PolicyError(f"-v {value!r}: unknown mount option {parts[2]!r}")
    if "ro" in options and "rw" in options:
        raise PolicyError(f"-v {value!r}: ro and rw both given")
    return Mount(source, target, read_only="rw" not in options,
                 options=tuple(o for o in options if o not in ("ro", "rw")))


def mount_target_problem(target: str, project_root: str, work_root: str | None = None,
                         work_what: str = "the host's work root") -> str | None:
    """Why a (clean) container path may not take a data mount, a -v or a Slurm container_mounts entry, or None: the
    root, or a place in what FlagPerf mounts itself, the project (read-only, at project_root), the run's vendor and
    case folders (under SEARCH_MOUNT_ROOT), the file the round hands the container its private environment in
    (ENV_FILE_IN_CONTAINER), and ``work_root`` (a docker host's work root, a Slurm entry's shared_dir: the job's
    scratch folder, the adaptation cache and the env file's host side, each mounted at its host path): a mount there
    would put other files in place of the code a round runs or of what the round writes and reads back."""
    if target == "/":
        return "the container's root"
    places = [(_normalised(project_root), "the project", "whose code a mount there would replace"),
              (SEARCH_MOUNT_ROOT, "FlagPerf's folder of the run's vendor and case folders",
               "whose code a mount there would replace"),
              (ENV_FILE_IN_CONTAINER, "the file FlagPerf hands the container's private variables in",
               "which a mount there would replace")]
    if work_root is not None:
        places.append((_normalised(work_root), work_what, "where the job's scratch folder and the adaptation "
                       "cache are mounted, which a mount there would replace"))
    for place, what, why in places:
        if is_under(target, place):
            return f"{'in ' if target != place else ''}{what} ({place}), {why}"
    return None


def work_root_source_problem(source: str, work_root: str | None) -> str | None:
    """Why a (clean) host path may not be mounted read-write on a host whose work root is ``work_root``, or None: the
    work root itself, a folder above it or one in it. The controller keeps its ended markers there
    (``<work_root>/.ended``, flagperf.hosts.local.Host.ended_root), outside the run's folder the round's container
    gets: a container that could write them could forge the proof that an attempt ended."""
    if work_root is None:
        return None
    root = _normalised(work_root)
    if is_under(root, source):
        where = "the host's work root" if source == root else "a folder above the host's work root"
    elif is_under(source, root):
        where = "in the host's work root"
    else:
        return None
    return (f"it is {where} ({root}), where the controller keeps its own records of which attempts ended "
            "(.ended): mount it read-only, or set work_root outside it")


def _normalised(path: str) -> str:
    """``path`` as clean_path writes a target (posixpath.normpath keeps a leading '//', which is_under then compares
    as written: a work root given as //data/work refused no mount at /data/work/x)."""
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal


# ---------------------------------------------------------------------------------------------- devices

def device_allowed(path: str, patterns: Iterable[str]) -> bool:
    return any(PurePosixPath(path).match(pattern) for pattern in (*DEVICE_PATTERNS, *patterns))


def check_device(value: str, patterns: Iterable[str] | None = None) -> str:
    """--device HOST[:CONTAINER[:PERMS]]. With ``patterns`` (the vendor's), HOST must match a device pattern;
    without (an inventory read before its vendor is known) only the form is checked."""
    parts = value.split(":")
    if len(parts) > 3:
        raise PolicyError(f"--device {value!r}: expected HOST_DEVICE[:CONTAINER_DEVICE[:rwm]]")
    device = clean_path(parts[0], "--device")
    if not device.startswith("/dev/"):
        raise PolicyError(f"--device {parts[0]!r} is refused: a device file under /dev is expected")
    if patterns is not None and not device_allowed(device, patterns):
        raise PolicyError(f"--device {parts[0]!r} is refused: not an accelerator or RDMA device (allowed: "
                          f"{', '.join((*DEVICE_PATTERNS, *patterns))}; a vendor adds patterns in vendor.yaml "
                          "container.device_patterns)")
    if len(parts) > 1 and parts[1]:
        clean_path(parts[1], "--device container path")
    if len(parts) == 3 and not re.fullmatch(r"[rwm]{1,3}", parts[2]):
        raise PolicyError(f"--device {value!r}: permissions are some of r, w, m")
    return value


def device_host_path(value: str) -> str:
    return clean_path(value.split(":")[0], "--device")


# ---------------------------------------------------------------------------------------------- options

def _option_shown(token: str) -> str:
    """An unsupported word of extra_options as an error may show it: an option's name only, never what is
    attached to it (``-eHF_TOKEN=...``, ``--token=...``: docker takes both forms), nor a stray word (a value)."""
    if token.startswith("--"):
        return repr(token.partition("=")[0])
    if token.startswith("-") and len(token) > 1:
        return repr(token[:2]) + (" (with what is attached to it, not shown)" if len(token) > 2 else "")
    return "a word that is no option (not shown: it may be a value)"


def parse_container_options(text: str, roots: Iterable[str] = DATA_ROOTS,
                            device_patterns: Iterable[str] | None = None) -> ContainerExtras:
    """The docker-run options FlagPerf's vendors use in ACCE_CONTAINER_OPT; anything else is refused by name."""
    roots = tuple(roots)
    extras = ContainerExtras()
    tokens = shlex.split(text)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option, eq, inline = token.partition("=")
        takes_value = option in ("--gpus", "--device", "-e", "--env", "-v", "--volume", "--ipc", "--group-add")
        if option == "--privileged":
            raise PolicyError("--privileged is refused here: a vendor file declares a privileged container, with "
                              "privileged_reason saying why")
        if not takes_value:
            raise PolicyError(f"unsupported docker option {_option_shown(token)} (supported: --gpus, --device, "
                              "-e/--env, -v/--volume, --ipc, --group-add)")
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise PolicyError(f"{option} needs a value")
            value = tokens[i + 1]
            i += 2
        if option == "--gpus":
            if not GPUS.fullmatch(value.strip('"')):
                raise PolicyError(f"--gpus {value!r}: expected all, a count or device=<ids>")
            extras.gpus = value
        elif option == "--device":
            extras.devices.append(check_device(value, device_patterns))
        elif option in ("-e", "--env"):
            name, sep, val = value.partition("=")
            if not sep:  # the whole word may be a secret given without its name: never quoted
                raise PolicyError(f"{option} needs NAME=VALUE (what was given is not shown)")
            if not ENV_NAME.match(name):
                raise PolicyError(f"{option} {name!r}=...: {name!r} is no variable name")
            extras.env[name] = val
        elif option in ("-v", "--volume"):
            extras.mounts.append(parse_volume(value, roots))
        elif option == "--ipc":
            if value not in ("host", "private", "shareable", "none"):
                raise PolicyError(f"--ipc {value!r}: expected host, private, shareable or none")
            extras.ipc = value
        else:
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}", value):
                raise PolicyError(f"--group-add {value!r}: expected a group name or number")
            extras.group_add.append(value)
    return extras


# Resource limits docker run takes (--ulimit NAME=SOFT[:HARD]): any other name fails when the container is created.
ULIMIT_NAMES = frozenset({"core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
                          "rss", "rtprio", "rttime", "sigpending", "stack"})
SIZE = re.compile(r"\d+[bkmgBKMG]?")  # docker's --shm-size form: 32g, 512m, a byte count


def vendor_container_problems(shm_size: str, ulimits: Mapping[str, int], devices: Iterable[str],
                              device_patterns: Iterable[str], ipc: str | None) -> list[tuple[str, str]]:
    """(key under container., why) for each option of a vendor file that docker, or the policy on the host, would
    refuse only when a round's container is created: checked as written, on the controller."""
    problems: list[tuple[str, str]] = []
    if not SIZE.fullmatch(shm_size):
        problems.append(("shm_size", f"{shm_size!r} is not a size such as 16g or 512m"))
    for name, value in ulimits.items():
        if name not in ULIMIT_NAMES:
            problems.append((f"ulimits.{name}", f"not a limit docker knows ({', '.join(sorted(ULIMIT_NAMES))})"))
        elif value < -1:
            problems.append((f"ulimits.{name}", f"{value} is neither a limit (0 or more) nor -1 (unlimited)"))
        elif value == -1 and name == "nofile":  # the kernel caps open files (fs.nr_open): unlimited is refused
            problems.append((f"ulimits.{name}", "-1 (unlimited) is refused by the kernel for open files; give a "
                                                "number such as 1048576"))
    patterns = list(device_patterns)
    for index, device in enumerate(devices):
        try:
            check_device(device, patterns)
        except PolicyError as exc:
            problems.append((f"devices.{index}", str(exc)))
    if ipc is not None and ipc not in ("host", "private", "shareable", "none"):
        problems.append(("ipc", f"{ipc!r}: expected host, private, shareable or none"))
    return problems


# ------------------------------------------------------------------------------ checks on the host itself

def resolved_mount(mount: Mount, facts: Mapping[str, PathFacts], roots: Iterable[str], what: str) -> Mount:
    """The mount with its source resolved on the host, checked again: under a data root that is itself one when
    resolved, a folder or a regular file. ``facts``: the host's answer for the source and every root."""
    found = facts[mount.source]
    resolved_roots = tuple(facts[root].path for root in roots if root in facts)
    if found.kind == "missing":
        raise PolicyError(f"{what} {mount.source!r} does not exist on the host")
    problem = mount_source_problem(found.path, resolved_roots)
    if problem:
        via = f" (it resolves to {found.path})" if found.path != mount.source else ""
        raise PolicyError(f"{what} {mount.source!r}{via} is refused: {problem}")
    if found.kind not in ("folder", "file"):
        raise PolicyError(f"{what} {mount.source!r} is refused: it is a {found.kind}, not a folder or file")
    return Mount(found.path, mount.target, mount.read_only, mount.options)


# Of a mounted search path folder's links that leave it, the host lists this many (enough to name them, bounded).
LINKS_LISTED = 10

# Where a container finds the folders of a host's search paths that lie outside its project: a folder of flagperf's
# own, never the host's path, which may hide what the image has there (FLAGPERF_VENDOR_PATH=/opt and vendor nvidia
# would mount over an NGC image's /opt/nvidia). SEARCH_MOUNT_ROOT/<kind>/<index>: the index-th folder (from 0) of the
# host's variable; the run's <vendor> or <family>/<case> of that folder lies below it.
SEARCH_MOUNT_ROOT = "/flagperf-search"
# Where a container finds the inventory's variables (a 0600 file of the host's, mounted read-only): not in its
# config, which ``docker inspect`` shows to everyone who may use the host's engine.
ENV_FILE_IN_CONTAINER = "/run/flagperf-env.json"
VENDOR_MANIFEST = "vendor.yaml"  # flagperf.config.vendors.MANIFEST (test_container_policy holds them equal)


@dataclass(frozen=True)
class SearchPath:
    """A host's search path variable (FLAGPERF_VENDOR_PATH, FLAGPERF_CASE_PATH) whose folders outside its project
    its containers get, of each folder only what the run needs: ``levels`` deep below it (a vendor: <vendor>, 1;
    a case: <family>/<case>, 2)."""

    variable: str
    what: str  # what one mounted folder is, in messages: "vendor folder"
    levels: int
    kind: str  # its folder under SEARCH_MOUNT_ROOT; also what one name on it is, in messages: "vendor"
    own: str  # the project's own folder of this kind, first on the search path (below the project root)
    # The files that make a folder of a name the one the round uses, shadowing later ones, any one of them (a vendor's
    # vendor.yaml: flagperf.config.vendors.vendor_search; a case's case.yaml: flagperf.paths.is_case_folder).
    markers: tuple[str, ...] = ()
    # (family, file): one more such file for a name of that family (an inference case's configurations.yaml).
    family_markers: tuple[tuple[str, str], ...] = ()
    # Whether the round reads a folder of the name without any marker: a vendor's (its engines), never a case's
    # (no case: case lookup passes it by).
    unmarked_read: bool = False

    def folder_of(self, source: str) -> str:
        """The search path's folder (as the variable names it) that a mount's source lies in."""
        return source.rsplit("/", self.levels)[0] or "/"

    def markers_of(self, name: str) -> tuple[str, ...]:
        """The files of which one makes a folder of ``name`` the name's (SearchPath.markers)."""
        family = name.split("/", 1)[0]
        return (*self.markers, *(file for of, file in self.family_markers if of == family))

    def in_container(self, index: int) -> str:
        """Where a container finds the index-th folder (from 0) of the host's variable."""
        return f"{SEARCH_MOUNT_ROOT}/{self.kind}/{index}"


VENDOR_FOLDERS = SearchPath(VENDOR_PATH_ENV, "vendor folder", levels=1, kind="vendor", own=VENDOR_FOLDER,
                            markers=(VENDOR_MANIFEST,), unmarked_read=True)
# By flagperf.paths.is_case_folder's rule: case lookup and the source digest take a folder for a case by these.
CASE_FOLDERS = SearchPath(CASE_PATH_ENV, "case folder", levels=2, kind="case", own=CASE_FOLDER,
                          markers=(CASE_MANIFEST,), family_markers=((INFERENCE_FAMILY, INFERENCE_CASE_FILE),))


def search_path_folder(folder: str, path: SearchPath) -> str:
    """One folder of a host's search path (absolute), checked as written."""
    root = clean_path(folder, f"{path.variable} folder")
    if root == "/":
        raise PolicyError(f"{path.variable} folder '/' is refused: the file system's root")
    credentials = credentials_in(root)
    if credentials is not None:
        raise PolicyError(f"{path.variable} folder {folder!r} is refused: a credentials folder ({credentials})")
    return root


def search_path_mount(root: str, name: str, path: SearchPath, target: str) -> Mount:
    """The mount of ``name`` (a vendor; a case's <family>/<case>) in a checked search path folder: at
    ``target``/``name`` in the container (``target``: the folder's place there, SearchPath.in_container), read-only."""
    source = f"{root}/{name}"
    credentials = credentials_in(source)
    if credentials is not None:
        raise PolicyError(f"{path.what} {source!r} is refused: a credentials folder ({credentials})")
    return Mount(source, f"{target}/{name}", read_only=True)


def resolved_search_path_mount(mount: Mount, facts: Mapping[str, PathFacts], path: SearchPath) -> Mount | None:
    """A search path mount (``mount.source``: <folder>/<name>, as the host's variable names the folder) resolved on
    the host: the read-only mount of the folder it resolves to, inside its search path folder (a link of any part
    below that folder may not lead out); None when the host has no such folder (nothing of the run there).
    ``facts``: the host's answer for the source and ``path.folder_of`` it."""
    found, root = facts[mount.source], facts[path.folder_of(mount.source)]
    if found.kind != "folder":
        return None
    via = f" (it resolves to {found.path})" if found.path != mount.source else ""
    if root.path == "/" or found.path == root.path or not is_under(found.path, root.path):
        raise PolicyError(f"{path.what} {mount.source!r}{via} is refused: it is outside its {path.variable} "
                          f"folder {root.path}")
    credentials = credentials_in(found.path)
    if credentials is not None:
        raise PolicyError(f"{path.what} {mount.source!r}{via} is refused: it is in a credentials folder "
                          f"({credentials})")
    return Mount(found.path, mount.target, read_only=True)


def links_out_problem(source: str, name: str, found: PathFacts, path: SearchPath,
                      project: tuple[str, str] | None = None, label: str | None = None) -> str | None:
    """Why a mounted search path folder (``source``: <folder>/<name> as the variable names it; ``found``: the host's
    facts of it, scanned) would not work in a container: a link in it that leaves it. The host follows it to its
    target (and the source digest counts the target's bytes), a container, which has the folder alone and at
    another path, would find nothing there. ``project``: the folder lies in the project (as the container has it,
    at project_root, and as it resolves on the host), which the container has whole: ``found``'s links are those
    that leave the project (local.links_leaving's ``tree``). ``label``: how the message names the folder (the
    variable's; "the project's" for its own folders)."""
    if not found.links_out:
        return None
    below, target, real = found.links_out[0]
    # Names as the host's folder holds them: a newline or a byte that is no UTF-8 would break the one line (and
    # a lone surrogate the JSON of a Prefect state), so each is shown escaped.
    file = printable(source if below == "." else f"{source}/{below}")  # ".": the folder itself was not listable
    others_count = len(found.links_out) - 1
    others = (f" (and {others_count}{'+' if len(found.links_out) >= LINKS_LISTED else ''} more such link(s))"
              if others_count else "")
    return f"{label or path.variable} {path.kind} {name!r}: {file} " + leaving_link_words(
        target, real, found.path, below in found.loops, project, others)


def leaving_link_words(target: str, real: str, folder: str, loops: bool, project: tuple[str, str] | None = None,
                       others: str = "", what: str | None = None) -> str:
    """How a link that leaves its folder (one of PathFacts.links_out: ``target`` as written, ``real`` where it leads
    on the host; ``folder``: the scanned folder, resolved) fails in a container, and what to do, after the link's
    name: the run's words (links_out_problem), and vendor check's and validate's, which name it before a round.
    ``loops``: it ends in a loop of links (PathFacts.loops); ``project``: as links_out_problem's; ``what``: how the
    words name the folder ("the vendor folder"; "its folder" by default). An empty ``target``: links_leaving could
    not look there, as no link has an empty target; ``real`` is then the error (local.unreadable_reason, 'EIO:
    Input/output error'), or the path from an agent older than it, which only saw EACCES there."""
    if not target:
        name, _, reason = real.partition(": ")
        if real.startswith("/") or name in ("EACCES", "EPERM"):
            return (f"cannot be looked at on this host (permission denied): whether it holds a link that would "
                    f"dangle in a container is unknown{others}: make the folder readable and enterable (chmod a+rX) "
                    f"by the user the host runs as")
        return (f"could not be read on this host: {reason or name}: whether it holds a link that would dangle in a "
                f"container is unknown{others}: check the file system there and run again")
    if loops:  # where it "leads" is a link on the way, not a place: neither out nor back in
        return (f"is a loop of links (to {printable(target)}; or a chain of more than the 40 links Linux follows): it "
                f"opens nowhere, here or in a container{others}: make it lead to the file")
    if project is not None:
        mounted, real_root = project
        if not is_under(real, real_root):
            how = f"links outside the project (to {printable(real)})"
        elif target.startswith("/"):
            how = (f"links to {printable(target)} by its path on this host, where a container has the project at "
                   f"{printable(mounted)}")
        else:
            how = f"links out of the project and back (to {printable(target)})"
        into = "the project"
    else:
        if not is_under(real, folder):
            how = f"links outside {what or 'its folder'} (to {printable(real)})"
        elif target.startswith("/"):
            how = (f"links to {printable(target)} by its path on this host, where a container does not have "
                   f"{what or 'the folder'}")
        else:
            how = f"links out of {what or 'its folder'} and back (to {printable(target)})"
        into = what or "the folder"
    return f"{how}; in a container it would dangle{others}: copy the file into {into}, or make the link relative " \
           "and inside it"


@dataclass(frozen=True)
class SearchEntry:
    """One non-empty folder of a host's search path variable: ``index``, its place among them (from 0), as the
    variable writes it and as an absolute path (a relative one is the project's), checked as written."""

    path: SearchPath
    index: int
    written: str
    folder: str


@dataclass(frozen=True)
class SearchMounts:
    """What a run's containers on one host get of its search paths (FLAGPERF_VENDOR_PATH, FLAGPERF_CASE_PATH): as
    search_mounts returns it, the variables' folders as written (``entries``) and the run's names to look for in
    them; once ``resolved`` with the host's answer for host_paths(), the mounts of the run's vendor and cases in the
    folders that resolve outside the project (each with the search path it comes from), and the variables as the
    container reads them (``env``: only those that differ from the host's)."""

    mounts: tuple[tuple[SearchPath, Mount], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    entries: tuple[SearchEntry, ...] = ()
    names: tuple[tuple[SearchPath, tuple[str, ...]], ...] = ()  # the run's vendor; its cases' <family>/<case>
    project_root: str = ""
    outside: tuple[SearchEntry, ...] = ()  # resolved: the entries that resolve outside the project (mounted)
    # The container's other mounts (a docker host's data mounts and -v's, a Slurm entry's shared_dir and
    # container_mounts), each SOURCE:TARGET, or a TARGET it has from the same host path: a link in a scanned folder
    # to a place under a target leads there in the container too, where the host resolves it inside the mounts.
    mounted: tuple[str, ...] = ()

    def all(self) -> list[Mount]:
        return [mount for _, mount in self.mounts]

    def of(self, path: SearchPath) -> list[Mount]:
        return [mount for kind, mount in self.mounts if kind == path]

    def names_of(self, path: SearchPath) -> tuple[str, ...]:
        return next((names for kind, names in self.names if kind == path), ())

    def own_folders(self) -> list[tuple[SearchPath, str, str]]:
        """The project's own folders of the run's names, first on the search paths (vendor_images/<vendor>,
        cases/<family>/<case>), which a container has as part of the project: (search path, name, path)."""
        if not self.project_root:
            return []
        return [(path, name, f"{self.project_root.rstrip('/')}/{path.own}/{name}")
                for path, names in self.names for name in names]

    def host_paths(self) -> list[str]:
        """The host paths ``resolved`` needs facts for: the project, its own folders of the run's names, each folder
        of the variables and each of the run's names in it, and in each of those the files that mark it the name's
        (SearchPath.markers: whether a vendor folder holds a vendor.yaml, a case folder a case.yaml)."""
        own = [source for _, _, source in self.own_folders()]
        if not self.entries and not own:
            return []
        named = self.own_folders() + [
            (e.path, n, f"{e.folder}/{n}") for e in self.entries for n in self.names_of(e.path)]
        return sorted({self.project_root, *own, *(e.folder for e in self.entries), *(source for _, _, source in named),
                       *(f"{source}/{marker}" for path, name, source in named for marker in path.markers_of(name))})

    def scan_paths(self) -> list[str]:
        """The host paths whose links ``resolved`` needs too (PathFacts.links_out, of ``tree``'s where they lie in
        it): the project's own folders of the run's names, and each of the run's names in each folder, which a
        container has as part of the project or mounted alone."""
        return sorted({*(source for _, _, source in self.own_folders()),
                       *(f"{e.folder}/{n}" for e in self.entries for n in self.names_of(e.path))})

    def tree(self) -> str | None:
        """The tree the scanned folders that resolve into it are part of in a container: the project."""
        return self.project_root or None

    def found_earlier(self, facts: Mapping[str, PathFacts]) -> dict[SearchEntry, set[str]]:
        """Of each entry, the run's names the round never reads in its folder: an earlier place on its search path
        (the project's own folder, first, or an earlier entry) is the name's, and so would this one be. Which folder
        is a name's goes by the round's own rule (flagperf.config.vendors.vendor_search, flagperf.paths.is_case_folder):
        a folder holding one of its SearchPath.markers (a vendor's vendor.yaml, a case's case.yaml). A vendor folder
        without one only adds engines, which the round reads wherever it lies, and hides no later folder of the
        vendor; a case folder without one is no case, and hides none."""
        earlier: dict[SearchEntry, set[str]] = {}
        for path, names in self.names:
            seen = {name for own_path, name, source in self.own_folders()
                    if own_path == path and self.is_the_names(path, name, source, facts)}
            for entry in (e for e in self.entries if e.path == path):
                here = {name for name in names if self.is_the_names(path, name, f"{entry.folder}/{name}", facts)}
                earlier[entry] = seen & here
                seen |= here
        return earlier

    @staticmethod
    def is_the_names(path: SearchPath, name: str, source: str, facts: Mapping[str, PathFacts]) -> bool:
        """Whether the folder ``source`` (``name`` in a folder of ``path``) is one the round takes for the name's, so
        that it shadows later ones: a folder, holding one of path.markers_of(name) where the search path has them."""
        markers = path.markers_of(name)
        return facts[source].kind == "folder" and (
            not markers or any(facts[f"{source}/{marker}"].present for marker in markers))

    @classmethod
    def is_read(cls, path: SearchPath, name: str, source: str, facts: Mapping[str, PathFacts]) -> bool:
        """Whether the round reads anything of the folder ``source`` (``name`` in a folder of ``path``) where no
        earlier place has the name: a vendor's folder (its engines, with or without vendor.yaml); a case's only
        with its case.yaml (is_the_names): a folder without one is no case, and its links are none of the run's."""
        return facts[source].kind == "folder" and (path.unmarked_read or cls.is_the_names(path, name, source, facts))

    def check_own_folders(self, facts: Mapping[str, PathFacts]) -> None:
        """The project's own folders of the run's names as the host has them (``facts``: for host_paths() and
        scan_paths()): in the project, and without a link that leaves it (in a container, which has the project
        alone, at project_root, it would dangle). PolicyError keyed project_root: the deployment the host has."""
        root = self.project_root
        real_root = facts[root].path
        for path, name, source in self.own_folders():
            found = facts[source]
            if not self.is_read(path, name, source, facts):
                continue  # the run's name is elsewhere on the search path
            if not is_under(found.path, real_root):
                raise PolicyError(f"the project's {path.kind} {name!r}: {printable(source)} (it resolves to "
                                  f"{printable(found.path)}) is outside the project {printable(real_root)}, which is "
                                  "all a container has of it", "project_root")
            problem = links_out_problem(source, name, found, path, (root, real_root), "the project's")
            if problem:
                raise PolicyError(problem, "project_root")

    def resolved(self, facts: Mapping[str, PathFacts]) -> SearchMounts:
        """Each folder resolved on the host (``facts``: its answer for host_paths()), and where it lies decides (as it
        decides where the source digest counts it, flagperf.results.provenance): one that resolves inside the project,
        which every container has at the host's project_root, is named there (as written where that leads to it); one
        that resolves outside it, also when written project-relative (a link out of the project), gets the run's
        vendor or cases mounted under SEARCH_MOUNT_ROOT, each resolved and checked again (a name the host lacks is
        left out: the variable still names its place, empty), and with no link in it that leaves it (facts for
        scan_paths(): it would dangle in the container; of a folder inside the project, a link that leaves the
        project, which the container has whole). PolicyError keyed env.<variable>; the project's own folders are
        checked first (check_own_folders: keyed project_root)."""
        if not self.entries and not self.own_folders():
            return self
        self.check_own_folders(facts)
        if not self.entries:
            return self
        root = self.project_root
        real_root = facts[root].path
        mounts: list[tuple[SearchPath, Mount]] = []
        outside: list[SearchEntry] = []
        env: dict[str, list[str]] = {}
        changed: set[str] = set()
        earlier = self.found_earlier(facts)
        for entry in self.entries:
            path, names = entry.path, self.names_of(entry.path)
            real = facts[entry.folder].path
            try:
                if is_under(real, real_root):
                    # Where the container finds it: the project is mounted at root, whatever root resolves to.
                    below = posixpath.relpath(real, real_root)
                    there = root if below == "." else f"{root.rstrip('/')}/{below}"
                    written = entry.folder if entry.written.startswith("/") else posixpath.normpath(
                        posixpath.join(root, entry.written))
                    seen = entry.written if written == there else there
                    for name in names:  # a link out of the project below it: the container would not find it
                        if name in earlier[entry] or not self.is_read(path, name, f"{entry.folder}/{name}", facts):
                            continue  # found earlier on the search path, or no case: the round never reads this one
                        source = f"{entry.folder}/{name}"
                        found = facts[source]
                        if found.kind == "folder" and not is_under(found.path, real_root):
                            raise PolicyError(f"{path.what} {source!r} (it resolves to {found.path}) "
                                              f"is refused: it is outside the project {real_root}, which is all a "
                                              f"container has of a {path.variable} folder inside it")
                        if found.kind == "folder":  # and so is a link in it that leaves the project
                            problem = links_out_problem(source, name, found, path, (root, real_root))
                            if problem:
                                raise PolicyError(problem)
                else:
                    seen = path.in_container(entry.index)
                    outside.append(entry)
                    for name in names:
                        found = resolved_search_path_mount(search_path_mount(entry.folder, name, path, seen), facts,
                                                           path)
                        if found is not None:
                            source = f"{entry.folder}/{name}"
                            # Mounted all the same (the container's search path is the host's, so it finds the same
                            # copy the digest counts), but a case found earlier on the path is never read: its links do
                            # not count.
                            problem = None if name in earlier[entry] or not self.is_read(path, name, source, facts) \
                                else links_out_problem(source, name, facts[source], path)
                            if problem:
                                raise PolicyError(problem)
                            mounts.append((path, found))
            except PolicyError as exc:
                raise PolicyError(str(exc), f"env.{path.variable}") from None
            env.setdefault(path.variable, []).append(seen)
            if seen != entry.written:
                changed.add(path.variable)
        return replace(self, mounts=tuple(mounts), outside=tuple(outside),
                       env=tuple((variable, ":".join(seen)) for variable, seen in env.items() if variable in changed))


def search_mounts(values: Mapping[str, str], vendor: str, cases: Sequence[str], project_root: str,
                  mounted: Iterable[str] = ()) -> SearchMounts:
    """What the run's containers get of a host's search paths (``values``: the host's variables) for its ``vendor``
    and ``cases`` (<family>/<case>), to be ``resolved`` on the host: every folder checked as written, also where no
    name is asked for (PolicyError keyed env.<variable>). Each folder keeps its place in the variable (SearchEntry's
    index), so the same folder wins a name in the container as on the host. ``mounted``: the container's other mounts
    (data mounts; Slurm's shared_dir and container_mounts; SOURCE:TARGET, or TARGET from the same host path), where a
    link in a vendor or case folder may lead.
    One function for every container runtime: the docker runtime and Slurm's pyxis (srun --container-mounts)."""
    entries: list[SearchEntry] = []
    for path in (VENDOR_FOLDERS, CASE_FOLDERS):
        written = [folder for folder in values.get(path.variable, "").split(":") if folder]
        try:
            for index, folder in enumerate(written):
                absolute = folder if folder.startswith("/") else posixpath.normpath(posixpath.join(project_root,
                                                                                                   folder))
                entries.append(SearchEntry(path, index, folder, search_path_folder(absolute, path)))
        except PolicyError as exc:
            raise PolicyError(str(exc), f"env.{path.variable}") from None
    return SearchMounts(entries=tuple(entries), project_root=project_root,
                        names=((VENDOR_FOLDERS, (vendor,)), (CASE_FOLDERS, tuple(cases))),
                        mounted=tuple(sorted({entry for entry in mounted  # '//' is the root too (mount_target)
                                              if posixpath.normpath(entry.rpartition(":")[2]).lstrip("/")})))


def resolved_device(value: str, facts: Mapping[str, PathFacts], patterns: Iterable[str], what: str) -> str:
    """--device with its host path resolved on the host, matching a device pattern, a character device (or a
    device folder a pattern names, such as /dev/dri)."""
    host_path = device_host_path(value)
    found = facts[host_path]
    if found.kind == "missing":
        raise PolicyError(f"{what} {host_path!r} does not exist on the host")
    if not device_allowed(found.path, patterns) or found.kind not in ("char-device", "folder"):
        via = f" (it resolves to {found.path}, a {found.kind})" if found.path != host_path else f" (a {found.kind})"
        raise PolicyError(f"{what} {host_path!r}{via} is refused: not an accelerator or RDMA device")
    rest = value.split(":")[1:]
    return ":".join([found.path, *(rest or [host_path])]) if found.path != host_path else value

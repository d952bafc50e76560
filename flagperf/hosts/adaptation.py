"""A vendor's case adaptation applied where the case runs (the container, or the host's process), before the
case starts: the environment file's values, requirements.txt installed and csrc/ built.

Installs and builds go to a cache on the host, one folder per content hash (the files, the Python, the image),
so that the same content is built once per image and host, not once per round: concurrent rounds wait on a
file lock, and a folder is made complete by one rename. Each round's folder keeps the log of the build it used.
A failed install or build is the round's failure, naming the file and the log (an input error: not retried).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.adaptation import (
    CSRC_SETUP,
    ENV_REFERENCE,
    Adaptation,
    expand_env,
    requirement_files,
    tree_digest,
)
from flagperf.errors import CaseUserError
from flagperf.hosts.inventory import MASK
from flagperf.hosts.local import SECRET_WORDS, URL_WITH_PASSWORD
from flagperf.paths import display_path

CACHE_FOLDER = "adaptations"  # under the host's work root, beside the runs' folders
CACHE_ENV = "FLAGPERF_ADAPTATION_CACHE"  # set by a container runtime: the cache's path inside the container
REQUIREMENTS_LOG = "adaptation_requirements.log"
CSRC_LOG = "adaptation_csrc_build.log"
COMPLETE = ".complete"
INSTALL_TIMEOUT_S = 3600


@dataclass
class Applied:
    """What was applied, for result.json's provenance."""

    adaptation: Adaptation
    env: dict[str, str] = field(default_factory=dict)
    installs: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The summary with secrets masked (secret_names)."""
        secret = secret_names(self.adaptation.env, self.env)
        written = self.adaptation.env
        return {**self.adaptation.summary(),
                "env": {name: MASK if name in secret else value for name, value in written.items()},
                "env_applied": {name: MASK if name in secret else value for name, value in self.env.items()},
                "installs": self.installs}


def secret_names(written: dict[str, str], applied: dict[str, str]) -> set[str]:
    """The environment file's names whose values are secret, decided in file order (the order they are applied
    in): a name that says it is one (HF_TOKEN, *_PASSWORD), a value as written or as applied that holds a URL with a
    password (MIRROR=$PIP_INDEX_URL, the host's index URL with its password), and a name that references a secret
    one: the host's (A=$HF_TOKEN) or an earlier line's, however many lines on (B=x$A holds the token as A does)."""
    secret: set[str] = set()
    for name, value in written.items():
        if (_is_secret(name, value) or URL_WITH_PASSWORD.search(applied.get(name, ""))
                or any(ref in secret or SECRET_WORDS.search(ref) for ref in _references(value))):
            secret.add(name)
    return secret


def _is_secret(name: str, value: str) -> bool:
    return bool(SECRET_WORDS.search(name) or URL_WITH_PASSWORD.search(value))


def _references(value: str) -> list[str]:
    """The names ``$NAME``/``${NAME}`` a value as written refers to (``$$`` is a literal dollar: expand_env)."""
    return [m.group(1) or m.group(2) for part in value.split("$$") for m in ENV_REFERENCE.finditer(part)]


def cache_root(job_dir: Path) -> Path:
    """The host's adaptation cache: the container runtime's mount, else beside the runs in the host's work root
    (a job lies at <work root>/<run>/<case>/round<N>/<host>_noderank<K>/attempt<M>/)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    parents = job_dir.resolve().parents
    if len(parents) > 5:
        return parents[4] / CACHE_FOLDER
    from flagperf.hosts.local import default_work_root  # a job run elsewhere (by hand, a test): the host's default

    return default_work_root() / CACHE_FOLDER


def runtime_key() -> str:
    """What a build depends on besides its sources and the image: this Python and its platform."""
    return f"{sys.executable}|{sys.version}|{sys.platform}|{os.uname().machine}"


def apply_adaptation(adaptation: Adaptation, round_dir: Path, cache: Path, image_id: str | None = None,
                     applied: Applied | None = None) -> Applied:
    """Apply the environment file, then requirements.txt, then csrc/ (it may need the requirements), to this
    process's environment and sys.path; the case's own processes inherit both. ``applied``: filled in as each step
    is done, so that when a later one fails the round's record still says what was applied (env_applied)."""
    applied = applied if applied is not None else Applied(adaptation)
    applied.env = expand_env(adaptation.env, os.environ)
    os.environ.update(applied.env)
    key = f"{runtime_key()}|{image_id or ''}"
    if adaptation.requirements is not None:
        folder = adaptation.requirements.parent
        digest = tree_digest(adaptation.requirements, *requirement_files(folder), key)
        target, record = _cached(cache, "requirements", digest, round_dir / REQUIREMENTS_LOG,
                                 lambda out, log: _pip_install_requirements(adaptation.requirements, folder, out, log),
                                 display_path(adaptation.requirements))
        applied.installs["requirements"] = record
        _add_path(applied, target)
    if adaptation.csrc is not None:
        digest = tree_digest(adaptation.csrc, key, applied.installs.get("requirements", {}).get("key", ""))
        target, record = _cached(cache, "csrc", digest, round_dir / CSRC_LOG,
                                 lambda out, log: _build_csrc(adaptation.csrc, out, log),
                                 display_path(adaptation.csrc / CSRC_SETUP))
        applied.installs["csrc"] = record
        _add_path(applied, target)
    return applied


def _add_path(applied: Applied, target: Path) -> None:
    """Importable here and in every process the case starts (training's workers)."""
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    applied.paths.append(str(target))


def _cached(cache: Path, kind: str, digest: str, round_log: Path, build: Any, what: str) -> tuple[Path, dict[str, Any]]:
    """The cache folder for ``digest``, built by ``build(folder, log)`` unless complete; the build's log is
    copied to the round folder either way."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{kind}-{digest[:24]}"
    log = cache / f"{kind}-{digest[:24]}.log"
    record: dict[str, Any] = {"key": digest, "path": str(target), "log": round_log.name}
    with open(cache / f"{kind}-{digest[:24]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another round on this host builds the same content: wait for it
        if (target / COMPLETE).is_file():
            record["status"] = "cached"
        else:
            staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=cache))
            started = time.monotonic()
            try:
                with open(log, "w", encoding="utf-8") as out:
                    code = build(staging, out)
                if code != 0:
                    shutil.copyfile(log, round_log)
                    last = _last_line(log)
                    raise CaseUserError(f"{what}: {'install' if kind == 'requirements' else 'build'} failed (exit "
                                        f"{code}); log {round_log.name}: {last}")
                (staging / COMPLETE).write_text(digest + "\n", encoding="utf-8")
                if target.exists():  # an incomplete folder of an interrupted build
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
            record["status"] = "built"
            record["seconds"] = round(time.monotonic() - started, 1)
    if log.is_file():
        shutil.copyfile(log, round_log)
    return target, record


# A compiler's own diagnostic, gcc's "ops.c:3:1: error: unknown type name 'x'" or nvcc's "ops.cu(3): error:
# identifier "x" is undefined": the first names the cause.
COMPILER_ERROR = re.compile(r"^\S+(:\d+(:\d+)?:|\(\d+\):) (fatal |catastrophic )?error\b")
ERROR_LINE = re.compile(r"\berror\b", re.I)
# The last line of a Python traceback ("ModuleNotFoundError: No module named 'torch'" from a setup.py): its
# exception's name holds "Error" within a word, which ERROR_LINE does not match.
EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception): ")
# pip's wrappers around a failed build, printed after the cause: "hint: See above for output from the failure",
# "error: legacy-install-failure", "error: metadata-generation-failed", "ERROR: Could not build wheels for x",
# "╰─> x", "[end of output]". They name no cause.
PIP_WRAPPER = re.compile(r"^(hint|note):|^error: [a-z-]+-(failure|failed|error|for-install)$"
                         r"|^ERROR: (Failed (building|to build)|Could not build wheels)|^Failed to build"
                         r"|^[×╰│]|^\[end of output\]|^[─-]+$")


def _last_line(log: Path) -> str:
    """The log's line that says why: a compiler's first diagnostic, else the last error or exception line pip did
    not wrap around it (a missing compiler, "No matching distribution found for ...", a setup.py's
    "ModuleNotFoundError: ..."), else the last line."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    telling = (next((line for line in lines if COMPILER_ERROR.match(line)), None)
               or next((line for line in reversed(lines) if (ERROR_LINE.search(line) or EXCEPTION_LINE.match(line))
                        and not PIP_WRAPPER.search(line)), None)
               or (lines[-1] if lines else "(empty)"))
    return telling[:300]


def _run(argv: list[str], cwd: Path, log: Any) -> int:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    try:
        return subprocess.run(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                              timeout=INSTALL_TIMEOUT_S, check=False).returncode
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {INSTALL_TIMEOUT_S} s\n")
        return 124


def _pip_install_requirements(requirements: Path, folder: Path, target: Path, log: Any) -> int:
    """pip install -r requirements.txt into ``target``, run in the requirements' folder so that relative
    paths in it (``--find-links wheels``, ``./pkg.whl``) mean the vendor's folder."""
    return _run([sys.executable, "-m", "pip", "install", "--target", str(target), "--no-warn-script-location",
                 "-r", str(requirements)], folder, log)


def _build_csrc(csrc: Path, target: Path, log: Any) -> int:
    """csrc/setup.py built with the host's (or image's) compiler and installed into ``target``. The sources are
    copied first: the project is mounted read-only in a container, and a build writes beside them."""
    with tempfile.TemporaryDirectory(prefix="flagperf-csrc-") as scratch:
        source = Path(scratch) / "csrc"
        shutil.copytree(csrc, source, symlinks=False)
        return _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                     "--target", str(target), "--no-warn-script-location", str(source)], source, log)

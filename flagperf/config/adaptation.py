"""A vendor's adaptation of a case, after FlagPerf's vendor guide, in this project's layout.

    cases/<family>/<case>/vendor/<vendor>/
      environment_variables.sh   ``export NAME=value`` / ``NAME=value`` lines, read (never run by a shell)
      requirements.txt           pip-installed before the case starts (into a cache per image and host)
      csrc/setup.py              operator sources, built and installed before the case starts (once per content)
      extern/hooks.py            named extension points of the standard case (EXTERN_HOOKS), nothing else
      config_<hw>x<n>x<p>.yaml   training scale settings (flagperf.config.cases)

What a vendor may not change (the guide's list): the model's structure and size, the optimizer type, the
data set and the initial checkpoint. The hooks are checked where a check can see them: statically here (what
extern/ calls), and at run time by the family's driver (parameter count and shapes, weights, optimizer class).
Everything here reads files; nothing a vendor wrote is executed by the reader.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.files import is_present, read_config_text, regular_file
from flagperf.errors import ConfigError
from flagperf.paths import display_path

ENV_FILE = "environment_variables.sh"
REQUIREMENTS_FILE = "requirements.txt"
CSRC_FOLDER = "csrc"
CSRC_SETUP = "setup.py"
EXTERN_FOLDER = "extern"
EXTERN_HOOKS_FILE = "hooks.py"

# The named extension points per family, and what each may do. A hook receives the standard case's own
# object and returns its replacement; the driver checks the replacement (see the family's driver).
EXTERN_HOOKS: dict[str, dict[str, str]] = {
    "training": {
        "wrap_model": "wrap_model(model, ctx) -> model: e.g. a fused-kernel module swap; same parameter count, "
                      "shapes and initial weights",
        "make_optimizer": "make_optimizer(cls, params, kwargs, ctx) -> optimizer: an instance of exactly cls (e.g. "
                          "a vendor's fused implementation chosen by kwargs)",
        "setup_distributed": "setup_distributed(device_type, backend) -> backend: the collective backend name "
                             "(e.g. the vendor's NCCL-compatible library)",
        "on_step": "on_step(ctx, step) -> None: called after every training step (e.g. a cache flush)",
    },
    "inference": {
        "model_forward": "model_forward(standard, model, inputs) -> outputs: around the case's eager forward",
        "engine_forward": "engine_forward(standard, engine, inputs) -> (outputs, seconds): around the case's "
                          "engine forward",
    },
}

# What extern/ code may not name: loading weights (the initial checkpoint) or building data (the data set).
FORBIDDEN_NAMES = {
    "load_state_dict": "loads weights: the initial checkpoint is not the vendor's to change",
    "load_checkpoint": "loads a checkpoint: the initial checkpoint is not the vendor's to change",
    "from_pretrained": "loads pretrained weights: the initial checkpoint is not the vendor's to change",
    "DataLoader": "builds a data loader: the data set is not the vendor's to change",
    "Dataset": "builds a data set: the data set is not the vendor's to change",
    "data_dir": "reads the data folder: the data set is not the vendor's to change",
}
FORBIDDEN_CALLS = {("torch", "load"): "torch.load loads weights: the initial checkpoint is not the vendor's to "
                                      "change"}

# The engine sets these for the case process; an environment file must not move them.
RESERVED_ENV = re.compile(r"^(FLAGPERF_.*|PYTHONPATH|PYTHONHOME|PYTHONUNBUFFERED)$")
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_UNQUOTED_UNSAFE = set(" \t;&|<>()`\\'\"*?[]~#!")


@dataclass(frozen=True)
class Adaptation:
    """What a vendor's folder of one case holds, read and checked (not applied)."""

    case: str
    family: str
    vendor: str
    folder: Path
    env: dict[str, str] = field(default_factory=dict)  # NAME -> value as written (references kept)
    requirements: Path | None = None
    csrc: Path | None = None
    extern: Path | None = None
    hooks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.env or self.requirements or self.csrc or self.extern)

    def summary(self) -> dict[str, object]:
        """What result.json's provenance records: a reviewer sees every adaptation point used."""
        return {"folder": display_path(self.folder), "env": dict(self.env),
                "requirements": display_path(self.requirements) if self.requirements else None,
                "csrc": display_path(self.csrc) if self.csrc else None,
                "extern": display_path(self.extern) if self.extern else None, "hooks": list(self.hooks)}


def adaptation_folder(case_folder: Path, vendor: str) -> Path:
    return case_folder / "vendor" / vendor


def parse_env_file(path: Path) -> dict[str, str]:
    """FlagPerf's environment_variables.sh, read as data: blank lines, ``#`` comments and ``[export ]NAME=value``
    with a value that is plain, 'single-quoted' or "double-quoted" (``$NAME`` / ``${NAME}`` references are kept
    and expanded when applied). Anything else (a command, a substitution, a function) is refused by line."""
    source = display_path(path)
    values: dict[str, str] = {}
    for number, raw in enumerate(read_config_text(path).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            raise ConfigError(source, f"line {number}", "not an assignment (only `export NAME=value` or "
                                                        "`NAME=value` lines are read; the file is never run)")
        name, value = match.group(1), _value(match.group(2).strip(), source, number)
        if RESERVED_ENV.match(name):
            raise ConfigError(source, f"line {number}", f"{name} is set by the engine, not by a vendor")
        values[name] = value
    return values


def _value(text: str, source: str, number: int) -> str:
    where = f"line {number}"
    if len(text) >= 2 and text[0] == text[-1] == "'":
        inner = text[1:-1]
        if "'" in inner:
            raise ConfigError(source, where, "a quote inside a single-quoted value")
        return inner.replace("$", "$$")  # literal: no reference is expanded
    if len(text) >= 2 and text[0] == text[-1] == '"':
        inner = text[1:-1]
        if any(c in inner for c in '"`\\') or "$(" in inner:
            raise ConfigError(source, where, "a double-quoted value may not hold quotes, backslashes, backticks "
                                             "or $(...) (nothing is run)")
        _check_references(inner, source, where)
        return inner
    bad = sorted({c for c in text if c in _UNQUOTED_UNSAFE})
    if bad or "$(" in text:
        shown = " ".join(bad) or "$("
        raise ConfigError(source, where, f"an unquoted value with shell syntax ({shown}): quote it, or set a plain "
                                         "value (the file is never run)")
    _check_references(text, source, where)
    return text


def _check_references(text: str, source: str, where: str) -> None:
    stripped = _REFERENCE.sub("", text.replace("$$", ""))
    if "$" in stripped:
        raise ConfigError(source, where, "only $NAME and ${NAME} references are expanded (no ${NAME:-x}, $1, $?)")


def expand_env(values: Mapping[str, str], environment: Mapping[str, str]) -> dict[str, str]:
    """The file's values with $NAME references expanded, in file order, against the environment and the
    file's earlier lines (an unset name is empty, as in the shell)."""
    current = dict(environment)
    expanded: dict[str, str] = {}
    for name, value in values.items():
        parts = value.split("$$")
        result = "$".join(_REFERENCE.sub(lambda m: current.get(m.group(1) or m.group(2), ""), part) for part in parts)
        current[name] = expanded[name] = result
    return expanded


def _python_files(folder: Path) -> Iterator[Path]:
    yield from sorted(p for p in folder.rglob("*.py") if p.is_file())


def check_extern(folder: Path, family: str) -> tuple[str, ...]:
    """extern/'s hooks (the public functions of hooks.py), checked without running anything: each is a named
    extension point of the family, and no file of extern/ names what loads weights or builds data."""
    known = EXTERN_HOOKS.get(family)
    hooks_file = folder / EXTERN_HOOKS_FILE
    if known is None:
        raise ConfigError(display_path(folder), None, f"the {family} family has no extension points "
                                                      f"(extern/ is for: {', '.join(sorted(EXTERN_HOOKS))})")
    regular_file(folder, EXTERN_HOOKS_FILE, display_path(folder), None, "the extern folder")
    for path in _python_files(folder):
        source = display_path(path)
        try:
            tree = ast.parse(read_config_text(path), filename=str(path))
        except SyntaxError as exc:
            raise ConfigError(source, f"line {exc.lineno}", f"invalid Python: {exc.msg}") from None
        for node in ast.walk(tree):
            problem = _forbidden(node)
            if problem:
                raise ConfigError(source, f"line {getattr(node, 'lineno', '?')}", problem)
    tree = ast.parse(read_config_text(hooks_file))
    hooks = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            if node.name not in known:
                raise ConfigError(display_path(hooks_file), f"line {node.lineno}",
                                  f"{node.name} is not an extension point of the {family} family (known: "
                                  f"{', '.join(sorted(known))}; a helper's name starts with _)")
            hooks.append(node.name)
    if not hooks:
        raise ConfigError(display_path(hooks_file), None, f"defines no hook (known: {', '.join(sorted(known))})")
    return tuple(hooks)


def _forbidden(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if isinstance(node, ast.alias):
        name = node.asname or node.name.rpartition(".")[2]
    if name in FORBIDDEN_NAMES:
        return f"{name}: {FORBIDDEN_NAMES[name]}"
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return FORBIDDEN_CALLS.get((node.value.id, node.attr))
    return None


def read_adaptation(case_folder: Path, case: str, family: str, vendor: str) -> Adaptation | None:
    """The vendor's adaptation of the case, checked; None when the vendor has none."""
    folder = adaptation_folder(case_folder, vendor)
    if not folder.is_dir():
        return None
    env_path, requirements = folder / ENV_FILE, folder / REQUIREMENTS_FILE
    env = parse_env_file(env_path) if is_present(env_path) else {}
    if is_present(requirements):
        regular_file(folder, REQUIREMENTS_FILE, display_path(folder), None, "the vendor's case folder")
    csrc = folder / CSRC_FOLDER
    if csrc.exists():
        regular_file(csrc, CSRC_SETUP, display_path(csrc), None, "the csrc folder")
    extern = folder / EXTERN_FOLDER
    if not (env or is_present(env_path) or is_present(requirements) or csrc.exists() or extern.exists()):
        return None  # a folder of scale files alone (config_<hw>x<n>x<p>.yaml) adapts nothing
    hooks = check_extern(extern, family) if extern.exists() else ()
    return Adaptation(case=case, family=family, vendor=vendor, folder=folder, env=env,
                      requirements=requirements if is_present(requirements) else None,
                      csrc=csrc if csrc.exists() else None, extern=extern if extern.exists() else None, hooks=hooks)


def tree_digest(*parts: Path | str) -> str:
    """sha256 over files (a folder's regular files by relative path, links not followed) and strings: the
    cache key of an install or a build, so that the same content is built once."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            digest.update(b"S" + part.encode() + b"\0")
            continue
        files = [part] if part.is_file() else sorted(p for p in part.rglob("*") if p.is_file() and not p.is_symlink())
        for path in files:
            rel = path.name if path == part else path.relative_to(part).as_posix()
            digest.update(b"F" + rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load_hooks(adaptation: Adaptation | None) -> dict[str, Callable[..., Any]]:
    """extern/hooks.py imported (where the case runs, never by `flagperf validate`): hook name -> function.
    extern/ is put on sys.path first, so that hooks.py can import its sibling modules."""
    if adaptation is None or adaptation.extern is None:
        return {}
    from flagperf.config.vendors import import_file

    folder = str(adaptation.extern)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = import_file(adaptation.extern / EXTERN_HOOKS_FILE,
                         f"flagperf_extern_{adaptation.vendor}_{adaptation.case}".replace("-", "_").replace(".", "_"),
                         family=adaptation.family)
    return {name: getattr(module, name) for name in adaptation.hooks}

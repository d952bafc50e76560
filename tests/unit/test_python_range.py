"""The supported Pythons (pyproject's requires-python, 3.10 on): the code must not use anything newer.

NGC's PyTorch images carry Python 3.10 (24.xx) or 3.12 (25.xx) and the in-container side runs on theirs, so
an API from 3.11 (datetime.UTC, enum.StrEnum, tomllib...) fails every round there at import. vermin checks
the standard-library APIs and syntax against 3.10; the oldest interpreter on this machine compiles every
file; every in-host module imports (here, with the test extras installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
OLDEST = (3, 10)
# Code that runs where the cases run (in-host, in-container) and on the controller; the benches run on the
# GPU host's own Python (an NGC image may carry 3.10), and the tests on any supported controller Python.
CHECKED = ["flagperf", "cases", "vendor_images", "flows", "tasks", "bench", "tests"]
IN_HOST_PACKAGES = ["flagperf"]


def python_files() -> list[Path]:
    return sorted(p for d in CHECKED for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_pyproject_states_the_range_and_ruff_targets_its_oldest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.10"
    assert project["tool"]["ruff"]["target-version"] == "py310"


def test_vermin_finds_nothing_newer_than_3_10() -> None:
    # --eval-annotations: annotations are evaluated by pydantic at run time, so `X | None` counts there.
    if importlib.util.find_spec("vermin") is None:
        pytest.fail("vermin is missing: pip install -e '.[test]'")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from vermin.main import main; sys.exit(main())",
         f"--target={OLDEST[0]}.{OLDEST[1]}-", "--violations", "--no-tips", "--eval-annotations",
         "--no-parse-comments", *CHECKED],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def oldest_interpreter() -> str | None:
    """A Python 3.10 that runs on this machine: pyenv's, else one on PATH (a pyenv shim may not run)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [str(p) for p in sorted(pyenv.glob(f"{OLDEST[0]}.{OLDEST[1]}.*/bin/python"), reverse=True)]
    candidates += [found] if (found := shutil.which(f"python{OLDEST[0]}.{OLDEST[1]}")) else []
    for python in candidates:
        probe = subprocess.run([python, "-c", "import sys; print(tuple(sys.version_info[:2]))"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == str(OLDEST):
            return python
    return None


def test_every_file_compiles_under_the_oldest_python() -> None:
    """Proves something on machines with a Python 3.10 interpreter (CI must have one: it fails there without);
    skips elsewhere."""
    python = oldest_interpreter()
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no Python 3.10 on this machine (pyenv install 3.10, or python3.10 on PATH)")
        pytest.skip("no Python 3.10 here; vermin still checks the APIs")
    # compile() only: nothing is imported (3.10 has no torch here) and no .pyc is written in the tree.
    script = ("import sys\nbad = []\nfor f in sys.argv[1:]:\n    try:\n        compile(open(f, encoding='utf-8')"
              ".read(), f, 'exec')\n    except SyntaxError as e:\n        bad.append(f'{f}:{e.lineno}: {e.msg}')\n"
              "print('\\n'.join(bad))\nsys.exit(1 if bad else 0)\n")
    files = [str(p) for p in python_files()]
    result = subprocess.run([python, "-c", script, *files], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(files) > 50  # the whole tree, not an empty glob


def in_host_modules() -> list[str]:
    names = []
    for package in IN_HOST_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module", in_host_modules())
def test_every_in_host_module_imports(module: str) -> None:
    # A run-time API missing on this interpreter, or an import of a package the core does not declare.
    importlib.import_module(module)

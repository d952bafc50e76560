"""Every command of every tutorial (docs/tutorials/*.md) is run by a test.

A page says how, in an HTML comment: `<!-- docs-test: shell -->` runs its ```bash blocks here, in order, in
one bash (`set -euo pipefail`) in an empty folder, against the session's Prefect server; `<!-- docs-test:
covered-by tests/...py -->` names the test file that runs them, and each command must appear there verbatim.
The one command not run here is the project's own install, which CI runs first (.ci/run)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
INSTALL = re.compile(r"^pip install -c constraints\.txt -e \S+$")
MODE = re.compile(r"<!-- docs-test: (shell( testbed)?|covered-by (?P<file>\S+)) -->")

pytestmark = pytest.mark.integration


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script(markdown: str) -> str:
    """The page's bash blocks as one script; the install line is left to CI."""
    blocks = re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines() if not INSTALL.match(line.strip())]
    return "\n".join(lines)


def _checkout_copy(folder: Path) -> Path:
    """The project's files as a reader's checkout has them (tracked and new, not ignored), nothing else."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def test_every_tutorial_says_how_it_is_tested() -> None:
    assert TUTORIALS, "docs/tutorials has pages"
    for page in TUTORIALS:
        text = page.read_text()
        assert MODE.search(text), f"{page.name}: no <!-- docs-test: ... --> line"
        assert _hooks().commands_in(text), f"{page.name}: a tutorial without a command"


@pytest.mark.parametrize("page", [p for p in TUTORIALS if "covered-by" in p.read_text()], ids=lambda p: p.stem)
def test_covered_commands_appear_in_their_test(page: Path) -> None:
    text = page.read_text()
    covering = ROOT / MODE.search(text)["file"]
    assert covering.is_file(), f"{page.name} names {covering}, which does not exist"
    source = " ".join(covering.read_text().split())
    for command in _hooks().commands_in(text):
        if INSTALL.match(command):
            continue
        assert " ".join(command.split()) in source, f"{page.name}: `{command}` is not run by {covering.name}"


@pytest.mark.parametrize("page", [p for p in TUTORIALS if "docs-test: shell" in p.read_text()],
                         ids=lambda p: p.stem)
def test_shell_tutorial_runs(page: Path, prefect_server: None, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    if "docs-test: shell testbed" in page.read_text():  # the hosts of tests/testbed, with the project deployed
        from tests.testbed.bed import deploy_project, require_testbed

        deploy_project(ROOT, require_testbed(min_hosts=2))

    folder = _checkout_copy(tmp_path / "checkout")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "FLAGPERF_WORK_ROOT": str(tmp_path / "work"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("FLAGPERF_CASE_PATH", None)
    script = "set -euo pipefail\n" + _script(page.read_text())
    done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, \
        f"{page.name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

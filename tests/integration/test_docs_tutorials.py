"""Every command of every tutorial (docs/tutorials/*.md) is run by a test.

Each page says so in an HTML comment, `<!-- docs-test: shell -->`: its ```bash blocks run here, in order, in one
bash (`set -euxo pipefail`) in a fresh copy of the checkout (where a reader types them), against the session's
Prefect server. `shell testbed` pages also get the project deployed on the test bed's hosts; `shell server`
pages get a home of their own, the test database, and this test's own ports in place of the page's. The one
command not run here is the project's own install, which CI runs first (.ci/run)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server_ports import DEFAULT_POOL, clear_what_ended_servers_left, default_pool_in_use, session_pool

from flows.server import watched

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
INSTALL = re.compile(r"^pip install -c constraints\.txt -e \S+$")
MODE = re.compile(r"<!-- docs-test: shell( testbed| server)? -->")
TUTORIAL_PORTS = ("4200", "4201")  # a server tutorial's ports: the test puts its own in their place

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


def _os_ports(count: int) -> list[str]:
    """Ports the OS gave a moment ago; a collision by the time the server binds is retried by the caller."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [str(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _run_server_tutorial(script: str, folder: Path, env: dict[str, str], tmp_path: Path
                         ) -> subprocess.CompletedProcess[str]:
    """A server tutorial: its own home (the sign-in file), the test database, and this test's ports in place of
    the page's, again on other ports when one was taken meanwhile. Whatever it started is stopped after."""
    url = os.environ.get("FLAGPERF_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI", "").lower() in {"true", "1", "yes"}:
            pytest.fail("CI=true and no FLAGPERF_TEST_POSTGRES_URL (.ci/run makes one)", pytrace=False)
        pytest.skip("no PostgreSQL: eval \"$(bash deployments/postgres/test-database.sh)\"")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {**env, "HOME": str(home), "DATABASE_URL": url}
    with default_pool_in_use():  # the page's server is on the default pool: no session clears it meanwhile
        clear_what_ended_servers_left(DEFAULT_POOL)
        done = _run_ported(script, folder, env)
    # What it left on the default pool, for the session pools' servers (refused by deployments of another pool),
    # unless another session's tutorial server serves that pool now.
    clear_what_ended_servers_left(session_pool())
    return done


def _run_ported(script: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The script on this test's ports in place of the page's, again on other ports when one was taken."""
    for _ in range(3):
        # In one pass, whole numbers only: a port given for 4200 may itself contain 4201.
        ports = dict(zip(TUTORIAL_PORTS, _os_ports(len(TUTORIAL_PORTS)), strict=True))
        ported = re.sub(r"(?<!\d)(" + "|".join(map(re.escape, ports)) + r")(?!\d)", lambda m, given=ports: given[m[1]],
                        script)
        # Watched: a killed pytest takes the tutorial's server along (it would keep the test database busy).
        process = subprocess.Popen(watched(["bash", "-c", ported]), cwd=folder, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=1200)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        said = stdout + stderr + ((folder / "server.out").read_text() if (folder / "server.out").exists() else "")
        if process.returncode == 0 or "address already in use" not in said.lower():
            break
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_every_tutorial_says_how_it_is_tested() -> None:
    assert TUTORIALS, "docs/tutorials has pages"
    for page in TUTORIALS:
        text = page.read_text()
        assert MODE.search(text), f"{page.name}: no <!-- docs-test: ... --> line"
        assert _hooks().commands_in(text), f"{page.name}: a tutorial without a command"


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
    script = "set -euxo pipefail\n" + _script(page.read_text())  # -x: a failure shows its command
    if "docs-test: shell server" in page.read_text():
        done = _run_server_tutorial(script, folder, env, tmp_path)
    else:
        done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=1200)
    assert done.returncode == 0, \
        f"{page.name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

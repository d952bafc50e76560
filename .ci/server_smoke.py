"""The server path, end to end, with whatever packages the running interpreter has (.ci/newest-in-range runs it
in a fresh venv holding the newest releases within pyproject.toml's ranges):

a real Prefect server as `flagperf server` runs it (flows.team_app; SQLite in a temporary folder, on a port the
OS gives), a process work pool,
`prefect --no-prompt deploy --all` from the repository root (prefect.yaml), a worker, and one evaluate run of
the smoke suite through its deployment (`prefect deployment run evaluate/evaluate`), as the README tells a
team to do it. Exits 1, naming the step and showing its output and the server's log, if any step fails or
leaves less than it should: every deployment of prefect.yaml listed by deploy and present on the server, the
flow run Completed, and every round of the suite a success with measured metrics, run by this interpreter's
packages (the pydantic version its results record).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import yaml

ROOT = Path(__file__).resolve().parents[1]
SUITE = "smoke"
SERVER_START_TIMEOUT_S = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 180))
RUN_TIMEOUT_S = 420  # the smoke suite takes about half a minute of it on a 2-core machine
PORT_ATTEMPTS = 3  # a port the OS gave may be taken by someone else before the server binds it


class SmokeFailure(Exception):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the process group (the server's or worker's children too), SIGKILL it after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} unreadable)"


def healthy(api_url: str) -> bool:
    try:
        with urlopen(f"{api_url}/health", timeout=5) as response:
            return response.status == 200
    except (URLError, OSError):
        return False


def start_server(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Prefect's server as `flagperf server` runs it (flows.team_app: Prefect's app, services and UI behind the
    front that checks Host and Origin) on SQLite; returns once /api/health answers. The launcher builds on Prefect's
    create_app and uvicorn's settings, which the newest releases in range may change."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        log = folder / f"server-{attempt}.log"
        server_env = {**env, "PREFECT_UI_ENABLED": "false",
                      "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{folder / 'prefect.db'}"}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "flows.team_app", "--host", "127.0.0.1", "--port",
                                     str(port), "--name", "127.0.0.1", "--name", "localhost", "--origin",
                                     f"http://127.0.0.1:{port}"], cwd=folder, env=server_env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline and not healthy(api_url):
            time.sleep(0.5)
        if proc.poll() is None and healthy(api_url):
            return proc, api_url, log
        stop_group(proc)
        if "address already in use" not in tail(log).lower():
            raise SmokeFailure(f"the Prefect server did not answer {api_url}/health within "
                               f"{SERVER_START_TIMEOUT_S:.0f} s (exit code {proc.returncode}):\n{tail(log)}")
    raise SmokeFailure(f"the Prefect server found its port taken {PORT_ATTEMPTS} times")


def prefect(step: str, *args: str, env: dict[str, str], timeout_s: float = 300) -> str:
    """Run a prefect CLI command from the repository root; its output, or SmokeFailure naming ``step``."""
    try:
        done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SmokeFailure(f"{step}: no answer within {timeout_s:.0f} s") from exc
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SmokeFailure(f"{step}: exit code {done.returncode}:\n{output[-6000:]}")
    return output


def declared_deployments() -> dict[str, str]:
    """prefect.yaml's deployments: name -> entrypoint."""
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    return {d["name"]: d["entrypoint"] for d in project["deployments"]}


def check_deployed(output: str) -> dict[str, str]:
    """Every deployment of prefect.yaml was reported by deploy and is on the server; returns name -> full name."""
    from prefect.client.orchestration import get_client

    declared = declared_deployments()
    if not declared:
        raise SmokeFailure("prefect.yaml declares no deployments")
    reported = dict(re.findall(r"Deployment '([^'/]+/([^']+))' successfully (?:created|updated)",
                               re.sub(r"[│\s]+", " ", output)))
    full_names = {name: full for full, name in reported.items()}
    missing = sorted(set(declared) - set(full_names))
    if missing:
        raise SmokeFailure(f"deploy: {missing} not reported as created:\n{output[-6000:]}")
    with get_client(sync_client=True) as client:
        on_server = {f"{client.read_flow(d.flow_id).name}/{d.name}": d for d in client.read_deployments()}
    absent = sorted(full for full in full_names.values() if full not in on_server)
    if absent:
        raise SmokeFailure(f"deploy: {absent} not on the server (it has {sorted(on_server)})")
    for name, full in full_names.items():
        entrypoint = on_server[full].entrypoint
        if entrypoint != declared[name]:
            raise SmokeFailure(f"deployment {full}: entrypoint {entrypoint!r}, prefect.yaml says {declared[name]!r}")
    return full_names


def check_run(flow_run_id: str, deployment: str, results: Path) -> list[str]:
    """The flow run completed and left a success with measured metrics for every round of the suite;
    returns one line per round."""
    from prefect.client.orchestration import get_client

    from flagperf.results.schema import read_result

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        expected = client.read_deployment_by_name(deployment).id
    if flow_run.deployment_id != expected:
        raise SmokeFailure(f"flow run {flow_run_id} is not the {deployment} deployment's")
    if not (flow_run.state and flow_run.state.is_completed()):
        raise SmokeFailure(f"flow run {flow_run_id} ended {flow_run.state!r}")
    run_dirs = [p for p in results.iterdir() if p.is_dir()]
    if len(run_dirs) != 1 or not (run_dirs[0] / "summary.json").is_file():
        raise SmokeFailure(f"{results}: expected one run folder with summary.json, found {run_dirs}")
    suite = yaml.safe_load((ROOT / "deployments" / "suites" / f"{SUITE}.yaml").read_text(encoding="utf-8"))
    pydantic_here = importlib.metadata.version("pydantic")
    lines = []
    for case in suite["cases"]:
        found = sorted((run_dirs[0] / case).glob("round*/*/result.json"))
        if not found:
            raise SmokeFailure(f"case {case}: no result.json in {run_dirs[0] / case}")
        for path in found:
            result = read_result(path)
            if result.status != "success" or not result.metrics or not all(m.value > 0 for m in result.metrics):
                raise SmokeFailure(f"{path}: status {result.status}, metrics {result.metrics}, "
                                   f"failure {result.failure}")
            ran_with = result.provenance.libraries.get("pydantic") if result.provenance else None
            if ran_with != pydantic_here:
                raise SmokeFailure(f"{path}: ran with pydantic {ran_with}, this interpreter has {pydantic_here}")
            lines.append(f"{case}: " + ", ".join(f"{m.name} {m.value:.4g} {m.unit}" for m in result.metrics))
    return lines


def smoke(folder: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(folder / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_WORKER_QUERY_SECONDS="2", PWD=str(ROOT))  # prefect.yaml's pull step: {{ $PWD }}
    server, api_url, server_log = start_server(folder, env)
    worker: subprocess.Popen[bytes] | None = None
    worker_log = folder / "worker.log"
    try:
        env["PREFECT_API_URL"] = os.environ["PREFECT_API_URL"] = api_url  # this process's client too
        print(f"server: {api_url}", flush=True)
        prefect("work-pool create", "work-pool", "create", "flagperf", "--type", "process", "--overwrite", env=env)
        started = time.monotonic()
        deployed = check_deployed(prefect("deploy --all", "deploy", "--all", env=env))
        print(f"deploy --all: {', '.join(sorted(deployed.values()))} ({time.monotonic() - started:.0f} s)",
              flush=True)
        with worker_log.open("wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "flagperf",
                                       "--work-queue", "controller", "--limit", "1"], cwd=ROOT, env=env,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        results = folder / "results"
        results.mkdir()
        started = time.monotonic()
        output = prefect("deployment run", "deployment", "run", deployed["evaluate"], "-p", f"suite={SUITE}",
                         "-p", f"results_dir={json.dumps(str(results))}", "--watch", "--watch-timeout",
                         str(RUN_TIMEOUT_S), env=env, timeout_s=RUN_TIMEOUT_S + 60)
        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
        if not flow_run_id:
            raise SmokeFailure(f"deployment run: no flow run id in its output:\n{output[-3000:]}")
        for line in check_run(flow_run_id.group(1), deployed["evaluate"], results):
            print(f"  {line}", flush=True)
        print(f"evaluate ({SUITE}) through the deployment: Completed ({time.monotonic() - started:.0f} s)",
              flush=True)
    except SmokeFailure as exc:
        logs = f"\n--- server log (tail)\n{tail(server_log)}"
        if worker is not None:
            logs += f"\n--- worker log (tail)\n{tail(worker_log)}"
        raise SmokeFailure(f"{exc}{logs}") from None
    finally:
        if worker is not None:
            stop_group(worker)
        stop_group(server)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="flagperf-server-smoke-") as folder:
        try:
            smoke(Path(folder))
        except SmokeFailure as exc:
            print(f"server smoke failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long the README's first command takes to set up, on this machine, in a fresh virtual environment.

    python bench/install_time.py [--variants lock,nolock,before] [--before REV] [--first-run]

Each variant: a fresh venv from this interpreter, the project exported from git (HEAD, or REV for
``before``) into a fresh folder, pip's cache off (a new machine has none), then the timed install:

- lock:   ``pip install -c constraints.txt -e .`` (the README's command)
- nolock: ``pip install -e .`` (the newest releases in range)
- before: ``pip install -e .`` at REV (default: the commit before this issue's change), for comparison

With --first-run, each variant then runs the README's first command's second half, ``flagperf run`` (the
smoke suite, under a temporary Prefect server) in its project copy, and the record gives the whole of it:
from the copy (what ``git clone`` does) to the report. The machine's own pip configuration (its package
indexes) is used as it is. Writes bench/results/install_time.json and .md, naming the machine and the code
(commit and source digest); exits 1 naming the variant whose install or run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flagperf.results.provenance import code_identity, host_info, source_digest  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DEFAULT_BEFORE = "03d47b6"  # main before issue 11: exact pins, training readers and models in the default
COMMANDS = {"lock": ["-c", "constraints.txt", "-e", "."], "nolock": ["-e", "."], "before": ["-e", "."]}


def export(rev: str, dest: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def folder_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def first_run(venv: Path, project: Path, env: dict[str, str]) -> tuple[float, str]:
    """``flagperf run`` as a newcomer types it in the fresh copy: seconds, and the run folder it printed."""
    run_env = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "PYTHONPATH", "PREFECT_HOME")}
    run_env["PREFECT_HOME"] = str(project / ".prefect-home")  # not this machine's own Prefect profile
    started = time.perf_counter()
    done = subprocess.run([str(venv / "bin" / "flagperf"), "run"], cwd=project, env=run_env, capture_output=True,
                          text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"install_time: flagperf run failed after the install (exit {done.returncode})")
    folder = next((line.split(":", 1)[1].split("(")[0].strip() for line in done.stdout.splitlines()
                   if line.startswith("run directory:")), "?")
    return seconds, folder


def measure(variant: str, rev: str, work: Path, with_run: bool) -> dict[str, object]:
    project, venv = work / f"{variant}-project", work / f"{variant}-venv"
    copy_started = time.perf_counter()
    export(rev, project)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    command = [*pip, "install", "--quiet", *COMMANDS[variant]]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"install_time: the {variant} install failed (exit {done.returncode})")
    freeze = subprocess.run([*pip, "freeze", "--exclude-editable"], capture_output=True, text=True, check=True)
    packages = [line for line in freeze.stdout.splitlines() if "==" in line]
    versions = dict(line.split("==", 1) for line in packages)
    site = next((venv / "lib").glob("python*/site-packages"))
    run_seconds, run_folder = first_run(venv, project, env) if with_run else (None, None)
    total = time.perf_counter() - copy_started if with_run else None
    return {"variant": variant, "revision": rev, "command": "pip install " + shlex.join(COMMANDS[variant]),
            "seconds": round(seconds, 1), "packages": len(packages), "site_packages_mib": round(folder_mib(site)),
            "torch": versions.get("torch"), "prefect": versions.get("prefect"),
            "sqlalchemy": versions.get("SQLAlchemy") or versions.get("sqlalchemy"),
            "transformers": versions.get("transformers"), "huggingface_hub": versions.get("huggingface-hub"),
            "click": versions.get("click"), "run_seconds": None if run_seconds is None else round(run_seconds, 1),
            "copy_to_report_seconds": None if total is None else round(total, 1), "run_folder": run_folder,
            "source_digest": source_digest(project)}  # of the copy measured, whatever the checkout holds now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="lock,nolock,before")
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git revision of the 'before' variant")
    parser.add_argument("--first-run", action="store_true", help="also time `flagperf run` after each install")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(COMMANDS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(COMMANDS)}")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()  # once: every variant measures the same commit
    code = code_identity()  # the checkout this ran from, before any variant (the rows name what each measured)
    rows = []
    with tempfile.TemporaryDirectory(prefix="install-time-") as tmp:
        for variant in variants:
            rev = args.before if variant == "before" else head
            row = measure(variant, rev, Path(tmp), args.first_run)
            ran = f", flagperf run {row['run_seconds']} s, copy to report {row['copy_to_report_seconds']} s" \
                if args.first_run else ""
            print(f"{variant}: {row['seconds']} s, {row['packages']} packages, {row['site_packages_mib']} MiB{ran}",
                  flush=True)
            rows.append(row)
    load = os.getloadavg()
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "bench/install_time.py", *sys.argv[1:]]),
              "python": platform.python_version(), "cpus": os.cpu_count(), "code": code,
              "machine": host_info(), "load_average_after": [round(x, 2) for x in load], "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "install_time.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Install time of the README's first command",
        "",
        f"`{report['command']}` on {report['date']}: Python {report['python']}, {report['cpus']} CPUs, load "
        f"average {report['load_average_after'][0]} when it ended (the machine is shared; figures vary with load). "
        "Fresh venv and project copy each, pip cache off; this machine's package indexes (PyPI plus local "
        "mirrors, torch from a local CPU wheel). "
        + ("`flagperf run` (the smoke suite, temporary Prefect server) timed after each install; copy to report = "
           "project copy + venv + install + run." if args.first_run else
           "Setup only: `flagperf run` itself is not included."),
        "",
        f"Machine: {report['machine']['cpu_model']}, {report['machine']['usable_cpus']} usable CPUs, "
        f"{report['machine']['memory_total_bytes'] / 2**30:.1f} GiB, {report['machine']['os']}. "
        f"Run from: {report['code']}; each row's copy: "
        + ", ".join(f"{r['variant']} {r['revision']} source {r['source_digest']}" for r in rows) + ".",
        "",
        "| variant | command | install s | flagperf run s | copy to report s | packages | site-packages MiB | torch "
        "| prefect | SQLAlchemy | transformers | huggingface-hub | click |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['variant']} ({r['revision']}) | `{r['command']}` | {r['seconds']} | "
                     f"{r['run_seconds'] or '-'} | {r['copy_to_report_seconds'] or '-'} | {r['packages']} | "
                     f"{r['site_packages_mib']} | {r['torch']} | {r['prefect']} | {r['sqlalchemy']} | "
                     f"{r['transformers'] or 'not installed'} | {r['huggingface_hub'] or 'not installed'} | "
                     f"{r['click']} |")
    (RESULTS / "install_time.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

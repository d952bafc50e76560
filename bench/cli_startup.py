"""`flagperf` start-up: `--help`, `list` and `validate`, against a bare Python that does the same work.

Per command, these sides run in fresh processes, interleaved (one of each per repeat, the order rotated from
repeat to repeat, so that a drift of the machine hits every side alike), each timed by the same wall clock
around the whole process (interpreter start, imports, the work, exit), its output thrown away:

  flagperf   this tree's `flagperf` (what its console script runs: `from flows.cli import main; main()`)
  before     the same at --before REV (a commit taken out with `git archive` into a temporary folder)
  baseline   a bare Python that imports typer and does the same work with the same calls, nothing else:
             --help: a typer app of one command prints its help; list: the cases, vendors and suites read and
             printed in rich tables; validate: the same files read by the same loaders

The figure is, per command, the median of the per-repeat ratios flagperf / baseline (and before / baseline):
how many times the bare work the command's start-up costs. A warm-up of each side first (page cache, .pyc).

    python bench/cli_startup.py [--repeats 15] [--before REV] [--out bench/results]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from paired import command_line, spread, write_record  # noqa: E402

VALIDATED = ["vendor_images/cpu/vendor.yaml", "deployments/inventories/example.yaml"]  # no case code in them
COMMANDS: dict[str, list[str]] = {"--help": ["--help"], "list": ["list"], "validate": ["validate", *VALIDATED]}
FLAGPERF = "import sys\nfrom flows.cli import main\nsys.argv[0] = 'flagperf'\nsys.exit(main())\n"
BASELINES = {
    "--help": """
        import typer
        app = typer.Typer(add_completion=False)
        @app.command()
        def run(suite: str = "smoke") -> None:
            "Run an evaluation."
        @app.command()
        def validate(files: list[str]) -> None:
            "Check config files."
        app(["--help"], prog_name="flagperf")
    """,
    "list": """
        import typer
        from rich.console import Console
        from rich.table import Table
        from flagperf.config.cases import available_cases, load_case
        from flagperf.config.models import load_suite
        from flagperf.config.plan import available_suites
        from flagperf.config.vendors import available_vendors, load_vendor
        console = Console()
        table = Table("case", "family", "peak", "description")
        for name in sorted(available_cases()):
            m = load_case(name).manifest
            table.add_row(name, m.family, m.peak or "-", m.description.strip())
        console.print(table)
        table = Table("vendor", "torch device", "monitors", "description")
        for name in sorted(available_vendors()):
            m = load_vendor(name).manifest
            table.add_row(name, m.torch_device, ", ".join(e.name for e in m.monitors) or "-", m.description.strip())
        console.print(table)
        table = Table("suite", "rounds", "cases", "description")
        for name, path in sorted(available_suites().items()):
            s = load_suite(path)
            table.add_row(name, str(s.rounds), ", ".join(s.cases), s.description.strip())
        console.print(table)
    """,
    "validate": f"""
        from pathlib import Path
        import typer
        from rich.console import Console
        from flagperf.config.vendors import load_vendor_manifest
        from flagperf.hosts.inventory import load_inventory
        console = Console()
        load_vendor_manifest(Path({VALIDATED[0]!r}))
        console.print(f"[green]ok[/]    {VALIDATED[0]} (vendor)")
        console.print(f"[green]ok[/]    {VALIDATED[1]} ({{len(load_inventory(Path({VALIDATED[1]!r})).hosts)}} hosts)")
    """,
}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def tree_at(rev: str, into: Path) -> str:
    """The project at ``rev`` (its tracked files) in ``into``; returns the commit."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def timed(code: str, args: list[str], tree: Path) -> float:
    """Seconds of one fresh process, from its start to its exit; it must succeed."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{args or code[:60]!r} in {tree} exited with {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved repeats per command")
    parser.add_argument("--before", help="a commit to time beside this tree (e.g. the one before a change)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="flagperf-cli-before-") as folder:
        sides: dict[str, tuple[str, Path, bool]] = {"flagperf": (FLAGPERF, ROOT, True)}
        before_commit = None
        if args.before:
            before_commit = tree_at(args.before, Path(folder))
            sides["before"] = (FLAGPERF, Path(folder), True)
        load_before = os.getloadavg()[0]
        results: dict[str, dict[str, list[float]]] = {}
        for name, command_args in COMMANDS.items():
            runs = {**sides, "baseline": (textwrap.dedent(BASELINES[name]), ROOT, False)}
            for code, tree, is_cli in runs.values():  # warm-up: page cache, bytecode
                timed(code, command_args if is_cli else [], tree)
            times: dict[str, list[float]] = {side: [] for side in runs}
            order = list(runs)
            for repeat in range(args.repeats):
                turn = order[repeat % len(order):] + order[:repeat % len(order)]
                for side in turn:
                    code, tree, is_cli = runs[side]
                    times[side].append(timed(code, command_args if is_cli else [], tree))
            results[name] = times
        load_after = os.getloadavg()[0]

    commands: dict[str, Any] = {}
    for name, times in results.items():
        entry: dict[str, Any] = {"args": COMMANDS[name], "seconds": {s: spread(t) for s, t in times.items()},
                                 "raw_s": times}
        for side in times:
            if side != "baseline":
                ratios = [a / b for a, b in zip(times[side], times["baseline"], strict=True)]
                entry[f"{side}_over_baseline"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                  "max": max(ratios)}
        commands[name] = entry
    dirty = bool(git("status", "--porcelain", "--", "flows", "flagperf", "bench"))
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "host": platform.node()},
        "load_average": {"before": load_before, "after": load_after},
        "code": {"flagperf": git("rev-parse", "HEAD") + (" (with uncommitted changes)" if dirty else ""),
                 "before": before_commit},
        "repeats": args.repeats,
        "commands": commands,
    }
    write_record(args.out, "cli_startup", record, markdown(record))
    print(markdown(record))


def cell(s: dict[str, Any]) -> str:
    return f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"


def markdown(rec: dict[str, Any]) -> str:
    has_before = rec["code"]["before"] is not None
    lines = ["# `flagperf` start-up against a bare Python doing the same work", "",
             f"Recorded {rec['date']} with `{rec['command']}` on {rec['machine']['cores']} cores (Python "
             f"{rec['machine']['python']}), load average {rec['load_average']['before']:.2f} before, "
             f"{rec['load_average']['after']:.2f} after; {rec['repeats']} interleaved repeats per command, each "
             "side a fresh process timed from its start to its exit.", "",
             f"flagperf: {rec['code']['flagperf']}" + (f"; before: {rec['code']['before']}" if has_before else ""),
             "",
             "| command | flagperf s | " + ("before s | " if has_before else "") + "baseline s | flagperf / baseline | "
             + ("before / baseline |" if has_before else ""),
             "|---|---|" + ("---|" if has_before else "") + "---|---|" + ("---|" if has_before else "")]
    for entry in rec["commands"].values():
        s = entry["seconds"]
        row = f"| `flagperf {' '.join(entry['args'])}` | {cell(s['flagperf'])} | "
        if has_before:
            row += f"{cell(s['before'])} | "
        row += f"{cell(s['baseline'])} | **{cell(entry['flagperf_over_baseline'])}** |"
        if has_before:
            row += f" {cell(entry['before_over_baseline'])} |"
        lines.append(row)
    lines += ["", "Seconds and ratios: median (min-max). A ratio is one repeat's flagperf (or before) time over the "
              "same repeat's baseline time; the baseline imports typer and does the command's work with the same "
              "library calls and nothing else (bench/cli_startup.py), so 1.0 is a command that costs nothing "
              "beyond its work.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""`transformers serve` swept over concurrency through the engine's own client, the same server measured by a
maintained client where one is installed, and the Pareto plot.

    python bench/serving_gpu.py              # GPU host: Llama-3.2-1B shape, bf16, random weights; c1 ... c64
    python bench/serving_gpu.py --quick      # CPU dry run: the tiny preset, fp32; c1, c2, c4
    options: --out DIR (records), --budget-s S (no new point or check past S), --guidellm PATH (the maintained
             client; default: `guidellm` on PATH; --quick runs it only when given), --server-arg ARG (added
             to the server's command, repeatable: e.g. --server-arg=--continuous-batching), --no-plots (keep
             the plots out of --out, as when the command shares the device tool's 8 returned files: the record
             holds the points, and --plot RECORD draws them here)

1. The preset with random weights is saved to a local folder first (flagperf.generate.models.random_checkpoint,
   with its word tokenizer); the vendor's `transformers-serve` engine folder starts the server on it once
   (flagperf.generate.server.start_server), and one request waits for its model to load.
2. The sweep: each concurrency is one round of the case through flagperf.entry.run_job (the whole generate
   code path: prompts, warm-up requests, the closed loop, requests.jsonl, the point's metrics and
   result.json), the case pointed at the running server as an ``endpoint``, the vendor's monitors sampling
   around it (energy per output token). Points run from low to high concurrency; none starts once the
   previous one's time, twice over, would pass the budget.
3. The report of that run folder (flagperf.results.report.build_report): its per-point table and its plots,
   the Pareto plot (output tokens/s per device against tokens/s per user, SLO frontier marked) and TTFT/TPOT
   against throughput, copied beside the records.
4. The maintained client, GuideLLM (bench/serving_client_check.py holds the two clients' definitions), at a
   few of the levels on the same server, each level ours then GuideLLM back to back: TTFT mean, TPOT mean,
   output tokens/s and the ratio ours / GuideLLM (goal: within 3 %). Skipped, with the reason recorded,
   where GuideLLM is not installed.

Records (serving_gpu[_quick].json and .md in --out) are rewritten after every point and check, so a run
stopped at its time limit keeps what it measured; the server's log is serving_gpu_server.log there. Exit 1
when the server or a round fails, 0 otherwise (figures are recorded, not judged).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.generate_gpu import Monitors, Stopped, stop_on_sigterm  # noqa: E402
from bench.paired import write_record  # noqa: E402
from flagperf.config.job import Job  # noqa: E402
from flagperf.config.plan import plan_run  # noqa: E402
from flagperf.config.vendors import load_vendor  # noqa: E402
from flagperf.entry import run_job  # noqa: E402
from flagperf.generate.engines import load_engine  # noqa: E402
from flagperf.generate.loadgen import ServingPrompt, Target, first_answer  # noqa: E402
from flagperf.generate.models import random_checkpoint  # noqa: E402
from flagperf.generate.serve import Tokens, check_requirements  # noqa: E402
from flagperf.generate.server import ServerProcess, log_tail, start_server  # noqa: E402
from flagperf.results.provenance import code_identity, host_info  # noqa: E402
from flagperf.results.report import build_report  # noqa: E402
from flagperf.results.schema import read_result  # noqa: E402
from flagperf.results.serving import ServingPoint, serving_points, slo_frontier  # noqa: E402

log = logging.getLogger("bench.serving")

CASE = "tiny-llama-serve"  # its serving keys; model, lengths and points are set below
ENGINE = "transformers-serve"
SERVER_LOG = "serving_gpu_server.log"
CLIENT_CHECK_ROUNDS = 1
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Setup:
    vendor: str
    preset: str
    precision: str
    input_len: int
    output_len: int
    levels: list[int]
    check_levels: list[int]
    budget_s: float
    min_requests: int

    def requests(self, concurrency: int) -> int:
        """Timed requests of a point: every slot refilled at least twice, and no fewer than min_requests."""
        return max(2 * concurrency, self.min_requests)


def setup(quick: bool, budget_s: float | None) -> Setup:
    if quick:  # the dry run proves the sweep, its report and records; a loaded CPU's figures are not judged
        return Setup("cpu", "tiny", "fp32", 16, 8, [1, 2, 4], [2], budget_s or 240.0, 4)
    # 128/128 tokens keep the sweep within a device command: c64 is 128 timed requests after 64 warm-ups.
    return Setup("nvidia", "llama-3.2-1b", "bf16", 128, 128, [1, 2, 4, 8, 16, 32, 64], [1, 16, 64],
                 budget_s or 360.0, 32)


def point_config(base: dict[str, Any], s: Setup, folder: Path, server: ServerProcess, concurrency: int
                 ) -> dict[str, Any]:
    return {**base, "model": s.preset, "precision": s.precision, "checkpoint_path": str(folder),
            "input_len": s.input_len, "max_new_tokens": s.output_len, "concurrency": [concurrency],
            "request_rates": [], "requests": s.requests(concurrency), "duration_s": None,
            "warmup_requests": concurrency, "timeout_s": TIMEOUT_S, "max_retries": 0,
            "endpoint": {"base_url": server.base_url, "model": str(folder), "devices": 1}}


def sweep_point(s: Setup, case_plan: Any, run_id: str, config: dict[str, Any], round_no: int, run_dir: Path
                ) -> dict[str, Any]:
    folder = run_dir / case_plan.name / f"round{round_no}" / "localhost_noderank0"
    folder.mkdir(parents=True)
    job = Job(run_id=run_id, case=case_plan.name, family=case_plan.family, round=round_no, host="localhost",
              vendor=s.vendor, config=config, config_origins=case_plan.origins, run_overrides={},
              command="bench/serving_gpu.py", image={"status": "none"})
    (folder / "job.json").write_text(job.model_dump_json(), encoding="utf-8")
    monitors = Monitors(s.vendor, folder)
    try:
        monitors.wait_sampling()
        started = time.perf_counter()
        code = run_job(job, folder)
        seconds = time.perf_counter() - started
    finally:
        monitor_state = monitors.stop()
    result = read_result(folder / "result.json")
    if code != 0 or result.status != "success":
        raise RuntimeError(f"concurrency {config['concurrency'][0]}: the round failed: "
                           f"{result.failure.message if result.failure else f'exit {code}'}")
    return {"concurrency": config["concurrency"][0], "round_s": seconds, "monitors": monitor_state}


def point_row(p: ServingPoint) -> dict[str, Any]:
    return {"point": p.label, "requests": p.requests, **{k: p.counts.get(k) for k in sorted(p.counts)},
            "output_tokens_per_s_per_device": p.per_device, "interactivity": p.interactivity,
            "tokens_per_s_per_user": p.figure("tokens_per_s_per_user"),
            "ttft_ms": {q: _ms(p.figure("ttft_s", q)) for q in ("p50", "p90", "p99")},
            "tpot_ms": {q: _ms(p.figure("tpot_s", q)) for q in ("p50", "p90", "p99")},
            "goodput_requests_per_s": p.goodput, "slo_p99_met": p.slo_met, "energy_per_token_j": p.energy_per_token_j}


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def client_check(s: Setup, binary: str | None, server: ServerProcess, folder: Path, exact: Any, work: Path,
                 levels: list[int], record: dict[str, Any], out: Path) -> None:
    """Ours then GuideLLM at each level on the same server (bench/serving_client_check.py's two clients)."""
    check: dict[str, Any] = {"client": "guidellm", "levels": []}
    record["client_check"] = check
    if binary is None:
        check["skipped"] = "no maintained client: guidellm is not on PATH (give --guidellm PATH)"
        return
    try:
        from bench.serving_client_check import guidellm, ours
    except ImportError as exc:
        check["skipped"] = f"bench/serving_client_check.py is not importable here: {exc}"
        return
    tokens = Tokens(folder)
    target = Target(server.base_url, str(folder), "chat", exact_fields=exact)
    done = []
    for concurrency in levels:
        if done and elapsed() + 2 * max(d["seconds"] for d in done) > s.budget_s:
            check["levels"].append({"concurrency": concurrency, "skipped": "budget"})
            continue
        count = s.requests(concurrency)
        generator = torch.Generator().manual_seed(concurrency)
        vocab = int(tokens.tokenizer.vocab_size)
        prompts = [ServingPrompt(i, tokens.text(torch.randint(0, vocab, (s.input_len,), generator=generator)
                                                .tolist()), s.input_len, s.output_len) for i in range(count)]
        started = time.perf_counter()
        mine = ours(target, prompts, concurrency, tokens)
        theirs = guidellm(binary, target, str(folder), prompts, concurrency, exact(s.output_len), work, concurrency)
        ratio = {f: mine[f] / theirs[f] for f in ("ttft_ms", "tpot_ms", "output_tokens_per_s") if theirs[f]}
        done.append({"concurrency": concurrency, "requests": count, "ours": mine, "guidellm": theirs,
                     "ratio_ours_to_guidellm": ratio,
                     "within_3_percent": {f: abs(r - 1.0) <= 0.03 for f, r in ratio.items()},
                     "seconds": time.perf_counter() - started})
        check["levels"] = [*[lv for lv in check["levels"] if "skipped" in lv], *done]
        write(out, record)


def elapsed() -> float:
    return time.perf_counter() - STARTED


def write(folder: Path, record: dict[str, Any]) -> None:
    record["total_s"] = elapsed()
    write_record(folder, "serving_gpu_quick" if record["quick"] else "serving_gpu", record, markdown(record))


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "met" if value else "missed"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def markdown(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [f"# serving: `transformers serve` swept over concurrency ({record['work']})", "",
             f"- state: **{record['state']}**",
             f"- command: `{record['command']}`; recorded {record['recorded']}; {record['total_s']:.0f} s "
             f"(budget {record['budget_s']:.0f} s)",
             f"- code: {record['code']}",
             f"- machine: {m['device']} on {m['host']['hostname']}; python {m['python']}, torch {m['torch']}, "
             f"transformers {m['transformers']}",
             f"- server: `{record.get('server_argv', '-')}`; its log: {SERVER_LOG}",
             f"- load: {record['load']}", f"- SLO: {record['slo']}", ""]
    if record.get("error"):
        lines += [f"**Stopped**: {record['error']}", ""]
    if record["points"]:
        lines += ["| point | requests | failed | truncated | tokens/s per device | interactivity | tokens/s per "
                  "user | TTFT ms p50/p99 | TPOT ms p50/p99 | goodput req/s | SLO p99 | J per token |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in record["points"]:
            lines.append(
                f"| {p['point']} | {_cell(p['requests'])} | {_cell(p.get('failed_requests'))} | "
                f"{_cell(p.get('truncated_requests'))} | {_cell(p['output_tokens_per_s_per_device'])} | "
                f"{_cell(p['interactivity'])} | {_cell(p['tokens_per_s_per_user'])} | "
                f"{_cell(p['ttft_ms']['p50'])} / {_cell(p['ttft_ms']['p99'])} | "
                f"{_cell(p['tpot_ms']['p50'])} / {_cell(p['tpot_ms']['p99'])} | "
                f"{_cell(p['goodput_requests_per_s'])} | {_cell(p['slo_p99_met'])} | "
                f"{_cell(p['energy_per_token_j'])} |")
        lines += ["", f"SLO frontier: {record.get('slo_frontier') or 'no point met the SLO'}", ""]
    if record.get("skipped_points"):
        lines += [f"Not run (budget): concurrency {', '.join(map(str, record['skipped_points']))}", ""]
    lines += [f"Plots: {', '.join(record['plots']) or 'none'}", ""]
    check = record.get("client_check")
    if check:
        lines.append("## The same server through GuideLLM (ours / GuideLLM; goal within 3 %)")
        if check.get("skipped"):
            lines.append(f"skipped: {check['skipped']}")
        for lv in check["levels"]:
            if "skipped" in lv:
                lines.append(f"- c{lv['concurrency']}: skipped ({lv['skipped']})")
                continue
            parts = [f"{f} {lv['ours'][f]:.4g} / {lv['guidellm'][f]:.4g} = {r:.3f}"
                     for f, r in lv["ratio_ours_to_guidellm"].items()]
            lines.append(f"- c{lv['concurrency']} ({lv['requests']} requests): " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU dry run: the tiny preset, vendor cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder for the records")
    parser.add_argument("--budget-s", type=float, default=None, help="no new point or check past this many seconds")
    parser.add_argument("--guidellm", default=None, help="the guidellm command (default: on PATH, not for --quick)")
    parser.add_argument("--server-arg", action="append", default=[], help="added to the server's command")
    parser.add_argument("--plot", type=Path, default=None, help="only draw the plots of this record into --out")
    parser.add_argument("--no-plots", action="store_true", help="copy no plot into --out (--plot redraws them)")
    args = parser.parse_args()
    if args.plot is not None:
        return redraw(args.plot, args.out)
    if args.budget_s is not None and args.budget_s <= 0:
        print(f"serving_gpu: --budget-s must be positive, got {args.budget_s:g}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not args.quick and not torch.cuda.is_available():
        print("serving_gpu: no CUDA device visible to torch; run with --quick for the CPU dry run", file=sys.stderr)
        return 2
    s = setup(args.quick, args.budget_s)
    guidellm_binary = args.guidellm or (None if args.quick else shutil.which("guidellm"))
    device = torch.device("cpu" if args.quick else "cuda")
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    plan = plan_run(cases=[CASE], vendor=s.vendor, results_dir=work / "results")
    case_plan = plan.cases[0]
    run_dir = work / "results" / plan.run_id
    engine = load_engine(s.vendor, ENGINE)
    spec = engine.server
    assert spec is not None
    vendor = load_vendor(s.vendor)
    record: dict[str, Any] = {
        "bench": "serving_gpu", "quick": args.quick, "state": "starting",
        "command": shlex.join(["python", "bench/serving_gpu.py", *sys.argv[1:]]),
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"), "code": code_identity(),
        "machine": {"device": vendor.spec_table().device, "host": host_info(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "guidellm": guidellm_binary or ("importable, no command" if importlib.util.find_spec("guidellm")
                                                    else "not installed")},
        "work": f"{s.preset} shape, random weights, {s.precision}, {s.input_len}/{s.output_len} tokens in/out",
        "load": (f"closed loop at each concurrency of {s.levels}, one round of the case each through run_job (the "
                 f"engine's client), the server started once; timed requests max(2 x C, "
                 f"{s.requests(1)}), C warm-up requests first; exact output lengths through the engine's "
                 "generation_config fields"),
        "slo": "the case's: p99 TTFT <= 2 s, p99 TPOT <= 100 ms, no failed request (MLPerf's Server bounds)",
        "budget_s": s.budget_s, "points": [], "rounds": [], "skipped_points": [], "plots": [], "total_s": 0.0,
    }
    write(args.out, record)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    server: ServerProcess | None = None
    code = 0
    try:
        check_requirements(engine)  # openai, accelerate, fastapi, uvicorn: one line naming what is missing
        folder = random_checkpoint(s.preset, s.precision, 0, work / "models", device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        fields = {"model_dir": str(folder), "dtype": spec.dtypes.get(s.precision, s.precision), "tensor_parallel": 1}
        server = start_server(spec, fields, args.server_arg, {}, args.out / SERVER_LOG, ready_timeout_s=TIMEOUT_S)
        record["server_argv"] = shlex.join(server.argv)
        target = Target(server.base_url, str(folder), "chat", exact_fields=spec.exact_output_fields)
        first = ServingPrompt(0, Tokens(folder).text([1, 2, 3, 4]), 4, s.output_len)  # loads the model
        error = first_answer(target, first, TIMEOUT_S)
        if error is not None:
            raise RuntimeError(f"the server answered no request: {error}; its log: {log_tail(args.out / SERVER_LOG)}")
        record["state"] = "sweeping"
        rounds: list[dict[str, Any]] = []
        for number, concurrency in enumerate(s.levels, start=1):
            if rounds and elapsed() + 2 * rounds[-1]["round_s"] > s.budget_s:
                record["skipped_points"] = s.levels[number - 1:]
                break
            config = point_config(case_plan.config, s, folder, server, concurrency)
            rounds.append(sweep_point(s, case_plan, plan.run_id, config, number, run_dir))
            record["rounds"] = rounds
            report(run_dir, args.out, record, plots=not args.no_plots)
            write(args.out, record)
        record["state"] = "checking the client" if guidellm_binary else record["state"]
        client_check(s, guidellm_binary, server, folder, spec.exact_output_fields, work, s.check_levels, record,
                     args.out)
        record["state"] = f"complete: {len(rounds)} of {len(s.levels)} points"
    except Stopped as exc:
        record["error"] = str(exc)
        code = 1
    except Exception as exc:  # recorded with what was measured before it, then shown
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        record["error"] = f"{type(exc).__name__}: {first_line}"
        traceback.print_exc()
        code = 1
    finally:
        if server is not None:
            server.stop()
    if code:
        record["state"] = f"stopped: {record['error']}"
    write(args.out, record)
    print(markdown(record))
    return code


def report(run_dir: Path, out: Path, record: dict[str, Any], plots: bool = True) -> None:
    """The run's report (the same code as `flagperf report`): its points, the SLO frontier and, with plots, the
    plots copied beside the record."""
    build_report(run_dir)
    points = serving_points(run_dir)
    record["points"] = [point_row(p) for p in points]
    record["serving_points"] = [asdict(p) for p in points]  # --plot redraws from these where matplotlib is
    frontier = slo_frontier(points)
    record["slo_frontier"] = (None if frontier is None else
                              f"{frontier.label}: {frontier.per_device:.4g} output tokens/s per device at "
                              f"{_cell(frontier.interactivity)} tokens/s per user")
    record["plots"] = []
    for name, copy in (("serving_tradeoff.png", "serving_gpu_pareto.png"),
                       ("serving_latency.png", "serving_gpu_latency.png")):
        if plots and (run_dir / "plots" / name).is_file():
            shutil.copyfile(run_dir / "plots" / name, out / copy)
            record["plots"].append(copy)
    if not record["plots"]:
        why = "matplotlib is not installed here" if plots else "--no-plots"
        record["plots_note"] = (f"plots not copied ({why}); draw them elsewhere with "
                                "python bench/serving_gpu.py --plot RECORD.json --out DIR")


def redraw(record_path: Path, out: Path) -> int:
    """The Pareto and latency plots from a record's points, on a machine with matplotlib (a lean GPU host
    measures without it)."""
    from flagperf.results.plotting import NOT_DRAWN, pyplot
    from flagperf.results.serving import plot_latency, plot_pareto

    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        points = [ServingPoint(**p) for p in record["serving_points"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"serving_gpu: --plot {record_path}: not a serving_gpu record with serving_points ({exc})",
              file=sys.stderr)
        return 2
    plt = pyplot()
    if plt is None:
        print(f"serving_gpu: {NOT_DRAWN}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    stem = record_path.stem
    made = [plot_pareto(plt, points, out / f"{stem}_pareto.png", f"{record.get('work', '')}: serving Pareto"),
            plot_latency(plt, points, out / f"{stem}_latency.png")]
    print("drawn:", ", ".join(str(m) for m in made if m is not None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

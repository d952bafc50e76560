"""The generate family's report section, plots and `flagperf compare` of serving curves, on hand-made result
files with known answers: points made by flagperf.generate.points from hand-made request records, a batch
engine's levels made by flagperf.generate.metrics from hand-made traces, and curves given point by point."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flagperf.generate.config import Slo
from flagperf.generate.engines import RequestTrace
from flagperf.generate.loadgen import RequestRecord
from flagperf.generate.metrics import level_metrics, level_stats
from flagperf.generate.points import point_metrics, point_stats, quality_metrics
from flagperf.results.compare import (
    compare_serving_runs,
    interpolate,
    pareto_frontier,
    serving_comparison_markdown,
)
from flagperf.results.metrics import STATISTICS, TransformerFlops
from flagperf.results.report import build_report
from flagperf.results.schema import Metric, RoundResult, write_result
from flagperf.results.serving import serving_points
from flows.cli import app

T0 = 1_800_000_000.0
SLO = {"ttft_s": 2.0, "tpot_s": 0.1, "e2el_s": None}


def write_round(run: Path, case: str, metrics: list[Metric], config: dict[str, object], round_no: int = 1,
                status: str = "success") -> Path:
    now = datetime.now(timezone.utc)
    result = RoundResult(run_id=run.name, case=case, family="generate", round=round_no, host="h1", node_rank=0,
                         vendor="cpu", status=status, started_at=now, finished_at=now, duration_s=10.0,
                         measured_seconds=5.0, metrics=metrics, config=config)
    folder = run / case / f"round{round_no}" / "h1_noderank0"
    write_result(folder / "result.json", result)
    return folder


def request(seq: int, label: str, ttft: float, tpot: float, tokens: int = 5, asked: int = 5,
            error: str | None = None, text: str = "") -> RequestRecord:
    chunks = [ttft + tpot * i for i in range(tokens)]
    return RequestRecord(point=label, phase="timed", seq=seq, prompt_index=seq, sent_at=T0 + seq,
                         requested_output=asked, exact=True, ttft_s=chunks[0] if chunks else None,
                         chunk_times_s=chunks, e2el_s=chunks[-1] if chunks else 0.5, output_tokens_client=tokens,
                         output_tokens_usage=tokens if error is None else None, error=error, output_text=text,
                         finish_reason="length")


def serving_metrics(label: str, records: list[RequestRecord], start: float, seconds: float,
                    references: dict[int, str] | None = None) -> list[Metric]:
    slo = Slo(**SLO)
    stats = point_stats(label, records, seconds, slo)
    return [*point_metrics(stats, (start, start + seconds), 2, slo, "test load"),
            *quality_metrics(label, records, references or {})]


def vllm_scrape(tokens: float, length: float, ttft_sum: float, count: float, tpot_sum: float) -> str:
    """Prometheus text as vLLM exposes it (two finish reasons, a gauge, histogram buckets)."""
    return "\n".join([
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f'vllm:generation_tokens_total{{model_name="m"}} {tokens}',
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{finished_reason="length",model_name="m"}} {length}',
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 3.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {count}',
        f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}',
        f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft_sum}',
        "# TYPE vllm:request_time_per_output_token_seconds histogram",
        f'vllm:request_time_per_output_token_seconds_bucket{{le="+Inf",model_name="m"}} {count}',
        f'vllm:request_time_per_output_token_seconds_count{{model_name="m"}} {count}',
        f'vllm:request_time_per_output_token_seconds_sum{{model_name="m"}} {tpot_sum}', ""])


@pytest.fixture(scope="module")
def serving_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A serving case (2 devices) at c2 (clean, meets the SLO), c4 (a failed and a truncated request, slower)
    and r0.5, with a 100 W monitor and the server's scrapes at c2; and a batch-engine case (hf) at c2."""
    run = tmp_path_factory.mktemp("runs") / "serving-run"
    # c2's prompts are 15 tokens by the server's usage: its total tokens/s, (15 + 5) x 4 / 1 s, is not its output's
    c2 = [dataclasses.replace(request(i, "c2", 0.1, 0.05, text="the answer"), prompt_tokens_usage=15)
          for i in range(4)]
    c4 = [request(0, "c4", 0.2, 0.08), request(1, "c4", 0.2, 0.08), request(2, "c4", 0.2, 0.08, tokens=3),
          request(3, "c4", 0.0, 0.0, tokens=0, error="HTTP 500: overloaded")]
    r05 = [request(i, "r0.5", 0.3, 0.02) for i in range(2)]
    metrics = [*serving_metrics("c2", c2, T0, 1.0, references={0: "the answer", 1: "another answer"}),
               *serving_metrics("c4", c4, T0 + 2, 2.0), *serving_metrics("r0.5", r05, T0 + 5, 4.0)]
    folder = write_round(run, "serve-case", metrics, {"engine": "vllm-serve", "precision": "bf16", "slo": SLO})
    samples = [{"type": "sample", "t": T0 - 1 + 0.05 * i, "power_w": 100.0} for i in range(240)]
    (folder / "monitor_system.jsonl").write_text("\n".join(json.dumps(s) for s in [
        {"type": "header", "monitor": "system", "interval_s": 0.05}, *samples]) + "\n", encoding="utf-8")
    scrapes = folder / "server_metrics"
    scrapes.mkdir()
    (scrapes / "c2.before.prom").write_text(vllm_scrape(100.0, 3.0, 1.0, 10.0, 0.5), encoding="utf-8")
    (scrapes / "c2.after.prom").write_text(vllm_scrape(120.0, 7.0, 1.4, 14.0, 0.7), encoding="utf-8")
    (scrapes / "c4.before.prom").write_text("not prometheus {{", encoding="utf-8")  # unreadable: left out
    (scrapes / "c4.after.prom").write_text(vllm_scrape(1.0, 1.0, 1.0, 1.0, 1.0), encoding="utf-8")
    # A batch engine's level: 2 requests of 4 tokens, 50 ms apart after a first token at 100 ms, in 0.5 s.
    traces = [RequestTrace(arrival=0.0, prompt_tokens=8, token_times=[0.1, 0.15, 0.2, 0.25], output_ids=[1] * 4)
              for _ in range(2)]
    hf = level_metrics(level_stats(2, traces, 0.5), (T0, T0 + 0.5), TransformerFlops(1000), "fp32", None)
    write_round(run, "batch-case", hf, {"engine": "hf", "precision": "fp32"})
    return run


def test_points_carry_every_figure_with_counts_summed_and_the_server_beside_the_client(serving_run: Path) -> None:
    from flagperf.results.summary import summarize

    points = {(p.case, p.label): p for p in serving_points(serving_run, summarize(serving_run).rows)}
    assert list(points) == [("batch-case", "c2"), ("serve-case", "c2"), ("serve-case", "c4"),
                            ("serve-case", "r0.5")]
    c2, c4, r05, hf = (points["serve-case", "c2"], points["serve-case", "c4"], points["serve-case", "r0.5"],
                       points["batch-case", "c2"])
    # c2: 4 requests x 5 tokens in 1 s on 2 devices; TPOT 50 ms for everyone.
    assert (c2.figure("output_tokens_per_s"), c2.per_device) == (pytest.approx(20.0), pytest.approx(10.0))
    assert c2.interactivity == pytest.approx(20.0) and c2.slo_met is True and c2.goodput == pytest.approx(4.0)
    assert c2.requests == 4 and c2.counts == {"failed_requests": 0, "truncated_requests": 0, "empty_outputs": 0,
                                              "token_count_mismatches": 0}
    assert c2.figure("exact_match") == pytest.approx(0.5)  # one of the two referenced outputs is exact
    # 100 W over the 1 s window, 20 output tokens.
    assert c2.energy_per_token_j == pytest.approx(100.0 * 1.0 / 20.0, rel=1e-6)
    # The server's figures: counter increases and histogram means between the two scrapes.
    assert c2.server == pytest.approx({"output_tokens": 20.0, "requests": 4.0, "ttft_s": 0.1, "tpot_s": 0.05})
    assert c4.server == {}  # its before-scrape is not Prometheus text
    # c4: 13 tokens of the 3 successful requests in 2 s; 1 failed, 1 truncated; 3 of 4 requests good.
    assert c4.per_device == pytest.approx(3.25) and c4.interactivity == pytest.approx(12.5)
    assert c4.counts["failed_requests"] == 1 and c4.counts["truncated_requests"] == 1 and c4.requests == 4
    assert c4.goodput == pytest.approx(1.5) and c4.figure("goodput_fraction") == pytest.approx(0.75)
    assert c4.slo_met is False  # a failed request fails the p99 check
    # Tokens/s per user is a rate per request: its slow tail, p10, is kept (5 / 0.52 s twice, 3 / 0.36 s once).
    slow, fast = 3 / 0.36, 5 / 0.52
    assert c4.figure("tokens_per_s_per_user") == pytest.approx((slow + 2 * fast) / 3)
    assert c4.figure("tokens_per_s_per_user", "p10") == pytest.approx(slow + 0.2 * (fast - slow))
    assert (r05.kind, r05.level, r05.per_device) == ("rate", 0.5, pytest.approx(10 / 4 / 2))
    # The batch engine: no per-device metric (one device) and no interactivity metric: taken from tpot_s.
    assert hf.per_device == pytest.approx(16.0) and hf.interactivity == pytest.approx(20.0)
    assert hf.slo_met is None and hf.requests == 2 and hf.goodput is None


def test_the_report_shows_every_point_its_counts_the_slo_frontier_and_the_plots(serving_run: Path) -> None:
    _, paths = build_report(serving_run)
    md = paths["markdown"].read_text()
    assert "## LLM serving (generate)" in md
    assert ("- **serve-case**: engine vllm-serve, bf16; SLO: p99 TTFT <= 2 s, p99 TPOT <= 0.1 s, no failed "
            "request; SLO frontier: c2, 10 output tokens/s per device at 20 tokens/s per user") in md
    assert "- **batch-case**: engine hf, fp32; SLO: no SLO recorded" in md
    assert "or some were truncated, empty or miscounted; their figures count the successful requests only: " \
           "serve-case c4." in md
    assert "| output tokens/s | total tokens/s (input + output) | output tokens/s per device |" in md
    rows = [line for line in md.splitlines() if line.startswith("| serve-case | 4 | - |")]
    assert rows[0].startswith("| serve-case | 4 | - | 4 (1 failed = 25.0%, 1 truncated, 0 empty, 0 count mismatch) "
                              "**flagged** | 6.5 | 6.5 | 3.25 |")  # prompts of no tokens: total = output
    assert "| 1.5 (75.0%) | **missed** |" in rows[0]
    assert "| 6.5 | 3.25 | 9.188 (p10 8.59) | 12.5 |" in rows[0]  # tokens/s per user: the mean and its slow tail
    assert "p10" in STATISTICS["mean"]  # how the report's "How these numbers were made" explains it
    assert "| serve-case | 2 | - | 4 (0 failed, 0 truncated, 0 empty, 0 count mismatch) | 20 | 80 | 10 |" in md
    # SLO (met on 4 requests: fewer than MLPerf's early stopping needs), MFU, J per token, quality, rounds
    assert ("| met (not confident: fewer requests than MLPerf's early stopping needs) | - | 5 | ROUGE-L 0.75, exact "
            "match 0.5 | 1 |") in md
    assert "| serve-case | - | 0.5 |" in md
    assert "| batch-case | 2 | - | 2 | 16 | - | 16 |" in md  # no total tokens/s recorded: none shown, not a 0
    page = paths["html"].read_text()
    assert "<th>output tokens/s</th>\n<th>total tokens/s (input + output)</th>" in page
    assert "<td>16</td>\n<td>-</td>\n<td>16</td>" in page  # the batch engine's row in report.html
    # Latency: TTFT of every c2 request is 100 ms; TPOT 50 ms.
    assert "| serve-case | 2 | - | 100 / 100 / 100 | 50 / 50 / 50 |" in md
    assert "| serve-case | 2 | - | 20 (20) | 4 (4) | 100 (100) | 50 (50) | - (300) |" in md
    for name in ("serving_tradeoff.png", "serving_latency.png"):
        assert (serving_run / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(plots/{name})" in md


def test_a_failed_round_keeps_its_points_and_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    c1 = [request(i, "c1", 0.1, 0.05) for i in range(2)]
    write_round(run, "serve-case", serving_metrics("c1", c1, T0, 1.0), {"engine": "e", "precision": "bf16",
                                                                         "slo": SLO}, status="failed")
    write_round(run, "serve-case", serving_metrics("c1", c1, T0, 2.0), {"engine": "e", "precision": "bf16",
                                                                         "slo": SLO}, round_no=2)
    (point,) = serving_points(run)
    assert point.rounds == 2 and point.failed_rounds == 1 and point.requests == 4
    assert point.figure("output_tokens_per_s") == pytest.approx((10.0 + 5.0) / 2)
    _, paths = build_report(run)
    assert "| 2 (1 from a failed round) |" in paths["markdown"].read_text()


def test_a_met_verdict_says_when_its_requests_were_too_few_for_mlperfs_early_stopping(tmp_path: Path) -> None:
    """slo_p99_confident is aggregated as slo_p99_met is: a round short of the requests MLPerf's early stopping needs
    makes a met verdict "not confident"; rounds with enough say nothing more, and results from before the metric (none
    of it) show the verdict alone."""
    from flagperf.results.serving import _verdict

    def verdicts(*confident: float | None) -> str:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        for n, value in enumerate(confident, start=1):
            metrics = [Metric(name="slo_p99_met@c1", value=1.0, unit="bool")]
            if value is not None:
                metrics.append(Metric(name="slo_p99_confident@c1", value=value, unit="bool"))
            write_round(run, "serve-case", metrics, {"engine": "e", "precision": "bf16", "slo": SLO}, round_no=n)
        (point,) = serving_points(run)
        return _verdict(point)

    short = "not confident: fewer requests than MLPerf's early stopping needs"
    assert verdicts(0.0) == f"met ({short})"
    assert verdicts(1.0) == "met"
    assert verdicts(None) == "met"  # a result from before slo_p99_confident
    assert verdicts(1.0, 0.0) == f"met (2/2 rounds; {short})"
    assert verdicts(1.0, None) == "met (2/2 rounds)"  # one round says nothing: not claimed either way
    # An open-loop point's row says the requests it had in flight: the mean (SGLang's) and the peak.
    run = tmp_path / "open"
    records = [request(i, "r2", 0.1, 0.05) for i in range(3)]  # E2EL 0.3 s each
    for n, record in enumerate(records):
        record.send_offset_s = record.scheduled_offset_s = 0.2 * n
    write_round(run, "serve-case", serving_metrics("r2", records, T0, 0.75),
                {"engine": "e", "precision": "bf16", "slo": SLO})
    _, paths = build_report(run)
    assert "| 20 | 4 | 1.2 (peak 2) | 4 (100.0%) |" in paths["markdown"].read_text()  # 0.9 s / 0.75 s
    # A missed verdict is read without its confidence.
    run = tmp_path / "missed"
    write_round(run, "serve-case", [Metric(name="slo_p99_met@c1", value=0.0, unit="bool"),
                                    Metric(name="slo_p99_confident@c1", value=0.0, unit="bool")],
                {"engine": "e", "precision": "bf16", "slo": SLO})
    (point,) = serving_points(run)
    assert _verdict(point) == "**missed**"


# --- compare ------------------------------------------------------------------------------------------------


def curve_run(root: Path, name: str, points: list[tuple[str, float, float, float, bool]],
              case: str = "serve-case", engine: str = "vllm-serve", setup: dict[str, object] | None = None) -> Path:
    """A run of one serving case whose points are given as (label, interactivity, tokens/s per device,
    goodput requests/s, SLO met), with ``setup`` as its round's serving.json (less the points)."""
    run = root / name
    metrics = []
    for label, interactivity, per_device, goodput, met in points:
        metrics += [Metric(name=f"interactivity@{label}", value=interactivity, unit="tokens/s"),
                    Metric(name=f"output_tokens_per_s_per_device@{label}", value=per_device, unit="tokens/s"),
                    Metric(name=f"output_tokens_per_s@{label}", value=per_device, unit="tokens/s"),
                    Metric(name=f"goodput_requests_per_s@{label}", value=goodput, unit="requests/s"),
                    Metric(name=f"slo_p99_met@{label}", value=float(met), unit="bool")]
    folder = write_round(run, case, metrics, {"engine": engine, "precision": "bf16", "slo": SLO})
    if setup is not None:
        (folder / "serving.json").write_text(json.dumps({**setup, "points": []}), encoding="utf-8")
    return run


CURVE_A = [("c1", 40.0, 400.0, 0.5, True), ("c4", 20.0, 800.0, 1.8, True), ("c16", 10.0, 1000.0, 2.0, False),
           ("c64", 8.0, 900.0, 1.0, False)]  # c64 is past saturation: c16 beats it on both axes
CURVE_B = [("c1", 50.0, 500.0, 0.6, True), ("c4", 30.0, 900.0, 2.7, True), ("c16", 15.0, 1300.0, 3.0, False)]


def test_frontier_and_interpolation_are_exact() -> None:
    frontier = pareto_frontier([(40, 400), (20, 800), (10, 1000), (8, 900), (20, 700)])
    assert frontier == [(10, 1000), (20, 800), (40, 400)]
    assert interpolate(frontier, 15) == pytest.approx(900.0)
    assert interpolate(frontier, 30) == pytest.approx(600.0)
    assert interpolate(frontier, 10) == 1000 and interpolate(frontier, 40) == 400
    assert interpolate(frontier, 9.99) is None and interpolate(frontier, 40.01) is None  # never extrapolated
    assert interpolate([(5.0, 7.0)], 5.0) == 7.0 and interpolate([(5.0, 7.0)], 5.1) is None


def test_compare_gives_throughput_at_equal_interactivity_and_the_goodput_ratio(tmp_path: Path) -> None:
    a, b = curve_run(tmp_path, "run-a", CURVE_A), curve_run(tmp_path, "run-b", CURVE_B, engine="sglang")
    (c,) = compare_serving_runs(a, b)
    assert (c.a_series, c.b_series) == ("serve-case (vllm-serve, bf16)", "serve-case (sglang, bf16)")
    assert c.a_range == (10.0, 40.0) and c.b_range == (15.0, 50.0)
    # Shared range 15-40: A's points at 20 and 40, B's at 15 and 30; each curve linear between its points.
    assert [r.interactivity for r in c.rows] == [15.0, 20.0, 30.0, 40.0]
    assert [r.a for r in c.rows] == pytest.approx([900.0, 800.0, 600.0, 400.0])
    assert [r.b for r in c.rows] == pytest.approx([1300.0, 1300.0 - 400.0 / 3, 900.0, 700.0])
    ratios = [13 / 9, (1300 - 400 / 3) / 800, 1.5, 1.75]
    assert [r.ratio for r in c.rows] == pytest.approx(ratios)
    assert c.geomean_ratio == pytest.approx(math.prod(ratios) ** 0.25)
    # The best goodput among the points meeting the SLO: A 1.8 at c4 (c16's 2.0 missed it), B 2.7 at c4.
    assert (c.a_best and c.a_best.label, c.b_best and c.b_best.label) == ("c4", "c4")
    assert c.goodput_ratio == pytest.approx(1.5)
    text = "\n".join(serving_comparison_markdown([c]))
    assert "A 1.8 requests/s at c4, B 2.7 requests/s at c4; **B/A = 1.500**" in text
    assert "| 30 | 600 | 900 | 1.500 |" in text and "| 15 | 900 | 1300 | 1.444 |" in text


def test_compare_leaves_a_failed_point_out_of_the_curve_and_the_goodput(tmp_path: Path) -> None:
    """A point whose every request failed in one round keeps the other rounds' figures, which are not the
    load's: compare leaves it out of A's curve and best goodput, and says so."""
    from flagperf.results.compare import compare_serving

    a = serving_points(curve_run(tmp_path, "run-a", CURVE_A))
    b = serving_points(curve_run(tmp_path, "run-b", CURVE_B, engine="sglang"))
    (whole,) = compare_serving(a, b)
    assert whole.a_best is not None and whole.a_best.label == "c4" and not whole.a_failed
    next(p for p in a if p.label == "c4").failed_point_rounds = 1
    (c,) = compare_serving(a, b)
    assert c.a_best is not None and c.a_best.label == "c1"  # c4's 1.8 is out; c1's 0.5 is the best left
    assert c.a_failed == ("c4",) and c.b_failed == ()
    next(p for p in a if p.label == "c1").failed_point_rounds = 1
    (c,) = compare_serving(a, b)
    assert c.a_range == (10.0, 10.0)  # c1 (40) and c4 (20) out of A's curve: c16 alone is left on it
    assert c.a_failed == ("c1", "c4")
    assert "**failed points left out** (every request failed in some round): A c1, c4; B none" in \
        "\n".join(serving_comparison_markdown([c]))


def test_compare_says_when_curves_share_no_interactivity_or_no_point_met_the_slo(tmp_path: Path) -> None:
    a = curve_run(tmp_path, "run-a", [("c1", 40.0, 400.0, 0.5, True), ("c4", 30.0, 800.0, 1.8, True)])
    b = curve_run(tmp_path, "run-b", [("c1", 20.0, 500.0, 0.6, False), ("c4", 10.0, 900.0, 2.7, False)])
    (c,) = compare_serving_runs(a, b)
    assert c.rows == [] and c.geomean_ratio is None and c.goodput_ratio is None
    text = "\n".join(serving_comparison_markdown([c]))
    assert "the curves share no interactivity: no throughput ratio" in text
    assert "A 1.8 requests/s at c4, B no point met the SLO; no ratio" in text
    other = curve_run(tmp_path, "run-c", CURVE_B, case="another-case")
    assert compare_serving_runs(a, other) == []  # only cases both runs measured are compared


STARTED = {"prompts": "8 synthetic prompts (seed 0) of 16 tokens, 16 out", "api": "chat",
           "server": {"argv": ["transformers", "serve", "--port", "8000"], "packages": {"transformers": "5.24.0",
                                                                                      "uvicorn": None}}}
AT_ENDPOINT = {"prompts": "sharegpt.json: 900 conversations of 4-1017 (mean 220.5) tokens, 4-256 (mean 180) out",
               "api": "chat", "endpoint": {"base_url": "http://10.0.0.5:8000", "model": "m",
                                           "version": {"version": "0.9.1"}}}


def test_the_report_names_the_prompts_and_the_server_and_compare_flags_other_workloads(tmp_path: Path) -> None:
    """What a lab publishes beside the figures: the prompt set with its token lengths and the API, the server's
    command with its packages' versions (or the endpoint, its model and version), from the round's serving.json;
    compare says when the two runs sent different work, which a ratio at equal interactivity cannot hide."""
    a = curve_run(tmp_path, "run-a", CURVE_A, setup=STARTED)
    b = curve_run(tmp_path, "run-b", CURVE_B, setup=AT_ENDPOINT)
    md = build_report(a)[1]["markdown"].read_text()
    assert "  - prompts: 8 synthetic prompts (seed 0) of 16 tokens, 16 out; chat API\n" in md
    assert "  - server: transformers serve --port 8000 (transformers 5.24.0)\n" in md  # no prefix_cache: older
    cached = curve_run(tmp_path, "run-cached", CURVE_A, setup={**STARTED, "server": {
        **STARTED["server"], "prefix_cache": "on: the engine's default; server_args [...] switches it off"}})
    assert "  - server: transformers serve --port 8000 (transformers 5.24.0); prefix cache on\n" in \
        build_report(cached)[1]["markdown"].read_text()
    md = build_report(b)[1]["markdown"].read_text()
    assert "- **serve-case**: engine vllm-serve's API at an endpoint; SLO: " in md  # its precision is the endpoint's
    assert "  - server: endpoint http://10.0.0.5:8000, model m, version 0.9.1\n" in md
    (c,) = compare_serving_runs(a, b)
    assert c.b_series == "serve-case (vllm-serve's API at an endpoint)"
    text = "\n".join(serving_comparison_markdown([c]))
    assert ("- **the workloads differ**, so the ratios compare different work: A 8 synthetic prompts (seed 0) of 16 "
            "tokens, 16 out; chat API; B sharegpt.json: 900 conversations") in text
    same = curve_run(tmp_path, "run-c", CURVE_B, setup=STARTED)
    assert "workloads differ" not in "\n".join(serving_comparison_markdown(compare_serving_runs(a, same)))


def _synthetic_set(input_mean: float = 16.0, seed: int = 0, server: float | None = None) -> dict[str, object]:
    """serving.json's prompt_set of a synthetic run (the fields runs have kept since it was recorded)."""
    spread = {"min": 16, "mean": input_mean, "max": 16}
    return {"source": "synthetic", "count": 39, "seed": seed, "input_tokens": spread,
            "output_tokens_asked": {"min": 16, "mean": 16.0, "max": 16},
            "counted_with": "the model folder's tokenizer",
            "input_tokens_server": {"min": 16, "mean": server, "max": 16} if server is not None else None}


def test_compare_says_the_workloads_differ_only_where_the_work_does(tmp_path: Path) -> None:
    """A run from before the prompts line labelled its lengths (and counted its synthetic prompts), one from after,
    the same case at a server the round started ("with the chat template") and at an endpoint without the model's
    tokenizer ("before the chat template"): the same work, by the recorded prompt sets, never by their wording. Another
    seed, other lengths (the text's, or the server's count) or another API are other work."""
    older = {**STARTED, "prompt_set": _synthetic_set()}
    started = {**STARTED, "prompts": "synthetic prompts (seed 0) of 16 tokens with the chat template, 16 out",
               "prompt_set": {**_synthetic_set(server=16.0), "set_size": 39, "first_index": 0}}
    endpoint = {**AT_ENDPOINT, "prompts": "synthetic prompts (seed 0) of 16 tokens before the chat template, 16 out",
                "prompt_set": {**_synthetic_set(input_mean=16.05, server=16.0), "counted_with": "words"}}

    def differ(a: dict[str, object], b: dict[str, object], name: str) -> bool:
        (c,) = compare_serving_runs(curve_run(tmp_path, f"{name}-a", CURVE_A, setup=a),
                                    curve_run(tmp_path, f"{name}-b", CURVE_B, setup=b))
        said = "workloads differ" in "\n".join(serving_comparison_markdown([c]))
        assert said == c.workloads_differ
        return said

    assert not differ(older, started, "versions") and not differ(started, endpoint, "modes")
    assert not differ(STARTED, {**STARTED, "prompts": "synthetic prompts (seed 0) of 16 tokens before the chat "
                                                      "template, 16 out"}, "lines")  # no prompt set: the line
    assert differ(started, {**started, "prompt_set": _synthetic_set(seed=1)}, "seed")
    assert differ(started, {**started, "prompt_set": _synthetic_set(input_mean=32.0)}, "length")
    assert differ(started, {**started, "prompt_set": _synthetic_set(server=40.0)}, "served")  # another template
    assert differ(started, {**started, "api": "completions"}, "api")
    # max_new_tokens forced out, or stopped at end of sequence: the same tokens asked, other work
    forced = {**started, "client": {"max_tokens": 16, "exact_output_fields": {"ignore_eos": True}}}
    assert differ(forced, {**started, "client": {"max_tokens": 16, "exact_output_fields": None}}, "eos")
    assert not differ(forced, {**forced, "client": {"max_tokens": 16, "exact_output_fields": {"min_tokens": 16}}},
                      "engines")  # each engine's own fields for it
    assert not differ(forced, started, "unrecorded")  # not known on one side: not said to differ
    assert differ(STARTED, {**STARTED, "prompts": "8 synthetic prompts (seed 0) of 32 tokens, 16 out"}, "old")


def test_cli_compare_prints_and_writes_the_serving_curves(tmp_path: Path) -> None:
    a, b = curve_run(tmp_path, "run-a", CURVE_A), curve_run(tmp_path, "run-b", CURVE_B)
    out = tmp_path / "cmp.md"
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Serving curves at equal interactivity" in result.output and "B/A = 1.500" in result.output
    text = out.read_text()
    assert "### serve-case: A serve-case (vllm-serve, bf16), B serve-case (vllm-serve, bf16)" in text
    assert "| 40 | 400 | 700 | 1.750 |" in text
    assert "| serve-case | interactivity@c1 | tokens/s | 40 | 50 | 1.250 |" in text  # the per-metric table stays


def test_the_gpu_bench_redraws_its_plots_from_its_record(serving_run: Path, tmp_path: Path) -> None:
    """bench/serving_gpu.py --plot: a lean GPU host records the points; a machine with matplotlib draws them."""
    import subprocess
    import sys
    from dataclasses import asdict

    record = tmp_path / "serving_gpu.json"
    record.write_text(json.dumps({"work": "test", "serving_points": [asdict(p) for p in serving_points(serving_run)]}))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "bench/serving_gpu.py", "--plot", str(record), "--out", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("serving_gpu_pareto.png", "serving_gpu_latency.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record.write_text("{}")
    done = subprocess.run([sys.executable, "bench/serving_gpu.py", "--plot", str(record), "--out", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 2 and "not a serving_gpu record" in done.stderr and "Traceback" not in done.stderr


def test_an_mfu_against_an_estimated_peak_is_an_upper_estimate(tmp_path: Path) -> None:
    from flagperf.results.schema import Peak
    from flagperf.results.serving import _mfu

    lower = Peak(value=1.0, unit="TFLOPS", source="derived", bound="lower", bound_reason="base clock")
    exact = Peak(value=1.0, unit="TFLOPS", source="datasheet")
    cells = {}
    for name, peak in (("lower", lower), ("exact", exact)):
        run = tmp_path / name
        metrics = [m.model_copy(update={"mfu": 1.2, "mfu_peak_key": "bf16", "mfu_peak": peak})
                   if m.name == "output_tokens_per_s@c1" else m
                   for m in serving_metrics("c1", [request(i, "c1", 0.1, 0.05) for i in range(2)], T0, 1.0)]
        assert any(m.mfu is not None for m in metrics)
        write_round(run, "serve-case", metrics, {"engine": "e", "precision": "bf16", "slo": SLO})
        (point,) = serving_points(run)
        assert point.mfu_estimated is (name == "lower")
        cells[name] = _mfu(point)
    assert cells == {"lower": "≤ 120.0% (above 100 % of the estimated peak, a lower bound)",
                     "exact": "120.0% (above 100 %: check the peak)"}


def test_the_console_shows_a_row_per_point_and_figures_only_beside_a_known_peak(serving_run: Path) -> None:
    """`flagperf report` (and `flagperf run`'s end) prints one row per generate point, not a "peak unknown" row per
    figure: the points' figures have no peak here, so none of them is a row of the measured-vs-peak table."""
    from typer.testing import CliRunner

    from flows.cli import app

    shown = CliRunner().invoke(app, ["report", str(serving_run)])
    assert shown.exit_code == 0, shown.output
    assert "unknown" not in shown.output and "@c2" not in shown.output
    assert "LLM serving, one row per point" in shown.output
    rows = [" ".join(line.replace("│", " ").split()) for line in shown.output.splitlines()]
    # case, point, completed/failed, requests/s, output tok/s, TTFT ms p50/p99, TPOT ms p50/p99, goodput
    assert "serve-case c2 4/0 4 20 100/100 50/50 4 (100.0%)" in rows
    assert "serve-case c4 3/1 flagged 1.5 6.5 200/200 80/80 1.5 (75.0%)" in rows
    assert "batch-case c2 2/0 4 16 100/100 50/50 -" in rows


def test_report_md_shows_a_row_per_point_not_an_unknown_peak_row_per_figure(serving_run: Path) -> None:
    """report.md's head had a headline row per figure of every point (tens in a sweep, each peak "unknown"): it has
    the console's compact view instead, a row per point; summary.csv keeps every figure."""
    import pandas as pd

    _, paths = build_report(serving_run)
    md = paths["markdown"].read_text()
    head = md.split("## LLM serving (generate)")[0]
    assert "@c2" not in head.split("## How these numbers were made")[0].replace("output_tokens_per_s@", "")
    assert not [line for line in head.splitlines() if line.startswith("| serve-case | ttft_s@")]
    assert "LLM serving, one row per point" in head
    assert "| serve-case | c2 | 4/0 | 4 | 20 | 100/100 | 50/50 | 4 (100.0%) |" in head
    assert "| serve-case | c4 | **3/1 flagged** |" in head  # a flagged point stands out
    # The power table: one row per point (its output tokens/s carries the point's window), not one per figure.
    power = head.split("## Power, energy and memory")[1].split("\n## ")[0]
    assert "| serve-case | output_tokens_per_s@c2 | 100 |" in power and "ttft_s@c2" not in power
    # How the figures were made: one line per figure over the points, not one per figure and point.
    assert "- serve-case / ttft_s at c2, c4, r0.5: " in head
    # Nothing is lost: summary.csv has every figure of every point.
    written = {m.name for m in json_metrics(serving_run / "serve-case/round1/h1_noderank0/result.json")}
    in_csv = set(pd.read_csv(paths["csv"]).query("case == 'serve-case'")["metric"])
    assert written and written <= in_csv
    assert "LLM serving, one row per point" in paths["html"].read_text()


def json_metrics(path: Path) -> list[Metric]:
    from flagperf.results.schema import read_result

    return read_result(path).metrics


def test_the_sites_run_page_shows_a_row_per_serving_point_not_a_row_per_figure(serving_run: Path,
                                                                                tmp_path: Path) -> None:
    """As report.md: the headline keeps only the serving figures with a known peak; the points are one row
    each in their own table (c4, with a failed request, marked)."""
    import re
    import shutil

    from starlette.testclient import TestClient

    from flagperf.results.summary import summarize, write_summary
    from flagperf.site.app import create_app

    root = tmp_path / "results"
    run = root / serving_run.name
    shutil.copytree(serving_run, run)
    write_summary(run, summarize(run))
    page = TestClient(create_app(root, None)).get(f"/runs/{run.name}/")
    assert page.status_code == 200
    headline = page.text.split('<table id="headline">')[1].split("</table>")[0] \
        if '<table id="headline">' in page.text else ""  # no serving figure of this run has a known peak
    assert "ttft_s@" not in headline and "unknown" not in headline
    serving = page.text.split('<table id="serving">')[1].split("</table>")[0]
    rows = re.findall(r"<tr( class=\"bad\")?><td>([^<]*)</td><td>([^<]*)</td>", serving)
    assert {(case, point) for _, case, point in rows} >= {("serve-case", "c2"), ("serve-case", "c4"),
                                                          ("serve-case", "r0.5")}
    assert [point for bad, case, point in rows if bad] == ["c4"]

"""What an operation point is checked against and what its figures cover, on this CPU: a large point's float64
host sample beside the device's own reference, the timed calls' output checked (not only the first call's),
the energy window holding the calls and nothing else, the bytes a call moves, the flaggems-core shape set, the
device plug-in's contract in place of device names, and bench/operation_gpu.py's host latency."""

from __future__ import annotations

import contextlib
import html
import json
import logging
import math
import re
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from flagperf.config.models import pydantic_error_to_config_error
from flagperf.config.plan import plan_run
from flagperf.config.vendors import load_vendor
from flagperf.config.yamlio import load_yaml_mapping
from flagperf.errors import CaseUserError, ConfigError
from flagperf.hosts.capacity import check_capacity
from flagperf.operation import driver, sampled
from flagperf.operation.config import OperationConfig, plan_points
from flagperf.operation.driver import Implementations, PointRunner, load_implementations
from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.operators import OPERATORS, counted, make_inputs
from flagperf.operation.sampled import NoSample, host_sample
from flagperf.operation.shape_sets import SHAPE_SETS
from flagperf.operation.timer import CacheFlush, TimingOptions, time_call, time_host, time_iterations
from flagperf.paths import display_path
from flagperf.results.operators import method_lines
from flagperf.results.schema import OperationReport, RoundResult, SpecTable
from tests.unit.test_operation import config as operation_config

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def config(**changes: Any) -> OperationConfig:
    """test_operation's small fast config, of one operator unless told."""
    return operation_config(**{"operators": ["add"], **changes})


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


def _implementation(wrap: Callable[[Any, int], Any]) -> OperatorImplementation:
    """An implementation returning ``wrap(native output, number of the call)``."""

    class Wrapped(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            calls = [0]

            def fn(*inputs: Any) -> Any:
                calls[0] += 1
                return wrap(native(*inputs), calls[0])
            return fn

    return Wrapped(ImplEnv(device=CPU, log=logging.getLogger("test")))


def _last_element_off(output: Any, _: int) -> Any:
    """Each output's last element off by one: where a kernel's tail block would be wrong."""
    outputs = output if isinstance(output, tuple) else (output,)
    wrong = []
    for o in outputs:
        o = o.clone()
        o.view(-1)[-1] += 1
        wrong.append(o)
    return tuple(wrong) if isinstance(output, tuple) else wrong[0]


def _run(cfg: OperationConfig, spec: SpecTable, impls: dict[str, OperatorImplementation],
         device_is_host: bool | None = None) -> PointRunner:
    """``device_is_host=False``: the CPU as an accelerator would be run, its large points' reference computed
    "on the device" (float32 for all but fp32) and held to a host sample (the CPU's own need none)."""
    runner = PointRunner(cfg, spec, CPU, Implementations(ready=impls), device_is_host)
    for point in plan_points(cfg):
        runner.run(point)
    return runner


# ------------------------------------------------------------------ a large point's float64 host sample



def write_operation_round(run: Path, run_id: str, case: str, points: list) -> None:
    """One successful operation round (round1 of h1) of ``case`` in the run folder ``run``, with these points."""
    from flagperf.results.schema import OperationReport, RoundResult, write_result

    now = datetime.now(timezone.utc)
    write_result(run / case / "round1" / "h1_noderank0" / "result.json", RoundResult(
        run_id=run_id, case=case, family="operation", round=1, host="h1", node_rank=0, vendor="nvidia",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0, metrics=[],
        config={}, operation=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={},
                                             points=points)))

def test_a_bug_the_device_reference_shares_is_caught_by_the_host_float64_sample(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    """A large point's reference runs on the device's own kernels. Where those share the implementation's bug
    (here: the device reference returns the same wrong last element), the comparison with it passes; the
    float64 sample computed on the host from the inputs copied off the device does not, and the error names the
    wrong element where it lies in the output (its last: the sample always holds the last row and column)."""
    real = driver.reference_for

    def shared_bug(op: Any, dtype: str) -> Callable[..., Any]:
        native = real(op, dtype)
        return lambda *inputs: _last_element_off(native(*inputs), 0)

    monkeypatch.setattr(driver, "reference_for", shared_bug)
    operators = ["mm", "bmm", "softmax", "sum", "gelu", "cat", "embedding", "index_select", "gather", "rotary",
                 "scaled_dot_product_attention"]
    cfg = config(operators=operators, reference_cpu_max_elements=0)
    runner = _run(cfg, cpu_spec, {"shared": _implementation(_last_element_off)}, device_is_host=False)
    points = {p.operator: p for p in runner.points}
    assert set(points) == set(operators)
    for p in points.values():
        assert p.status == "failed", (p.operator, p.error)
        assert "reference float64 on cpu at " in p.error and p.reference_sample.startswith("float64 on cpu at "), \
            p.error
    # the worst element where it is in the output, not in the sample: mm's M16 x N344 output, its last element
    mm = points["mm"]
    assert "worst at [15, 343]:" in mm.error, mm.error
    assert mm.reference_sample == "float64 on cpu at 1024 of 5504 output elements (16 of 16 rows x 64 of 344 " \
                                  "columns)"
    assert "worst at [31, 127]:" in points["cat"].error  # the second input's rows lie below the first's
    rotary = points["rotary"]  # q's last element (T16 x H4 x D32) is wrong first
    assert "output 0: " in rotary.error and "worst at [15, 3, 31]:" in rotary.error, rotary.error

    # without the shared bug the same implementation fails against the reference itself, and native passes both
    monkeypatch.setattr(driver, "reference_for", real)
    runner = _run(cfg, cpu_spec, {"native": _implementation(lambda out, _: out),
                                  "shared": _implementation(_last_element_off)}, device_is_host=False)
    by = {(p.operator, p.implementation): p for p in runner.points}
    assert all(by[(op, "native")].status == "passed" for op in operators)
    assert "reference float64 on cpu)" in by[("mm", "shared")].error  # the whole reference's line


def test_a_small_point_has_the_whole_float64_host_reference_and_no_sample(cpu_spec: SpecTable) -> None:
    runner = _run(config(operators=["softmax"]), cpu_spec, {"native": _implementation(lambda out, _: out)})
    (point,) = runner.points
    assert point.status == "passed" and point.reference == "float64 on cpu" and point.reference_sample is None


def test_on_the_cpu_a_large_point_has_the_whole_float64_reference_and_no_redundant_sample(cpu_spec: SpecTable
                                                                                        ) -> None:
    """The CPU is the host: a large point's reference is float64 on the host already, so a sample of it
    computed on the host again checks nothing more; the record said 'float64 on cpu and a float64 host sample'
    where the schema says null."""
    runner = _run(config(operators=["softmax", "mm"], reference_cpu_max_elements=0), cpu_spec,
                  {"native": _implementation(lambda out, _: out)})
    assert [(p.status, p.reference, p.reference_sample) for p in runner.points] == \
        [("passed", "float64 on cpu", None)] * 2


def test_the_report_says_what_the_points_were_checked_against() -> None:
    """The method lines' "checked against" counted each round's points under labels of their own, while the
    operator's headline counted points merged over rounds under other labels: the same words, two counts. Both are
    checked_counts now: by kind (the reasons are the operator table's footnotes), each point-implementation pair
    once whatever its rounds; rounds that checked a point differently say so instead of the last one winning."""
    from datetime import datetime, timezone

    from flagperf.results.operators import Checked, checked_counts, method_lines, point_checked, points_of
    from flagperf.results.schema import OperationReport, OperatorPoint, RoundResult

    def point(m: int, reference: str, sample: str | None, status: str = "passed",
              implementation: str = "native") -> OperatorPoint:
        return OperatorPoint(operator="mm", group="gemm", dtype="bf16", shape={"M": m}, source="given",
                             implementation=implementation, status=status, reference=reference,
                             reference_sample=sample)

    def result(number: int, points: list[OperatorPoint]) -> RoundResult:
        now = datetime.now(timezone.utc)
        return RoundResult(run_id="r", case="op-gemm", family="operation", round=number, host="h", node_rank=0,
                           vendor="nvidia", status="success", started_at=now, finished_at=now, duration_s=1.0,
                           measured_seconds=1.0, metrics=[], config={},
                           operation=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={},
                                                     points=points))

    sample = "float64 on cpu at 4 of 9 output elements"
    first = [point(1, "float64 on cpu", None), point(2, "float32 on cuda", sample),
             point(3, "float32 on cuda", sample, "failed"),
             point(4, "float32 on cuda", "none: cross_entropy's output is one mean over all 4 rows"),
             point(5, "float32 on cuda", "none: cross_entropy's output is one mean over all 5 rows"),
             point(6, "float32 on cuda", "float64 on cpu at 1 of 1 output elements", "skipped"),
             point(7, "float32 on cuda", sample)]
    second = [*first[:6], point(7, "float32 on cuda", "none: the host sample ran out of memory")]
    # the same kind for another reason in each round is no difference: the first round's reason is its footnote's;
    # a round that skipped a point checked nothing, whatever its record states
    first += [point(8, "float32 on cuda", "none: the host sample ran out of memory"),
              point(9, "float32 on cuda", sample)]
    second += [point(8, "float32 on cuda", "none: the host sample's copy failed"),
               point(9, "float64 on cpu", "none: no bf16 form on this device", "skipped")]
    # another implementation that has no form of a point (skipped) was checked on fewer: the line says whose pairs
    for points in (first, second):
        points += [point(1, "float64 on cpu", None, implementation="compile"),
                   point(2, "float32 on cuda", sample, "skipped", implementation="compile")]
    # one whose every point was skipped (its library missing) was in no kind, as if not compared: each kind names
    # every implementation, 0 where it has none of it
    for points in (first, second):
        points += [point(1, "float64 on cpu", None, "skipped", implementation="flaggems")]
    results = [result(1, first), result(2, second)]
    assert ("  - checked against: float64 on cpu, whole output (2 point-implementation pairs: native 1, compile 1, "
            "flaggems 0); float32 on cuda + float64 host sample (3 point-implementation pairs: native 3, compile 0, "
            "flaggems 0); float32 on cuda only, no host sample (3 point-implementation pairs: native 3, compile 0, "
            "flaggems 0); rounds differ: float32 on cuda + float64 host sample / float32 on cuda only, no host sample "
            "(1 point-implementation pair: native 1, compile 0, flaggems 0)") in method_lines(results)
    merged = points_of(results)
    assert checked_counts(merged) == {
        "float64 on cpu, whole output": 2, "float32 on cuda + float64 host sample": 3,
        "float32 on cuda only, no host sample": 3,
        "rounds differ: float32 on cuda + float64 host sample / float32 on cuda only, no host sample": 1}
    by_shape = {p.shape: p for p in merged}
    assert point_checked(by_shape["M8"]) == Checked("float32 on cuda only, no host sample",
                                                    why="the host sample ran out of memory")
    assert point_checked(by_shape["M9"]) == Checked("float32 on cuda + float64 host sample",
                                                    elements="4 of 9 output elements")
    assert (by_shape["M9"].reference, by_shape["M9"].reference_sample) == ("float32 on cuda", sample)


def test_each_point_in_the_report_says_what_it_was_checked_against(tmp_path: Path) -> None:
    """The operator tables said how a point was timed but not what its output was checked against: an operator
    engineer could not tell a point held to a float64 host sample from one held to the device's own kernels alone.
    Each dtype x shape row says it (the whole reference, the host sample's elements, or no sample with a numbered
    reason under the table), the operator's headline row (report, Prefect artifact, site) counts the kinds with the
    reasons, and summary.json keeps both per point."""
    from flagperf.results.markup import plain
    from flagperf.results.operators import (
        OPERATOR_HEADER,
        collect_points,
        operation_markdown,
        operator_cells,
        operator_summaries,
    )
    from flagperf.results.schema import OperatorPoint

    sample = "float64 on cpu at 1024 of 5504 output elements (16 of 16 rows x 64 of 344 columns)"

    def point(operator: str, shape: int, impl: str, reference: str | None, reference_sample: str | None,
              status: str = "passed") -> OperatorPoint:
        return OperatorPoint(operator=operator, group="g", dtype="bf16", shape={"M": shape}, source="given",
                             implementation=impl, status=status, reference=reference,
                             reference_sample=reference_sample, latency_s=1e-3, value=1.0, unit="GB/s")

    # a record from before the short reasons: cross_entropy's full text, its sizes in it
    why = ("cross_entropy's output is one mean over all 8 rows, which depends on every one of its 1026048 logits (a "
           "sample of rows would check no part of it), and those are over the 4294967296 the host computes in float64 "
           "block by block (the point's reference is the device's own kernels alone)")
    points = [point("mm", 1, "native", "float64 on cpu", None), point("mm", 1, "fast", "float64 on cpu", None),
              point("mm", 2, "native", "float32 on cuda", sample), point("mm", 2, "fast", "float32 on cuda", sample,
                                                                         "failed"),
              point("cross_entropy", 3, "native", "float32 on cuda", f"none: {why}"),
              point("mm", 4, "native", None, None, "skipped")]
    write_operation_round(tmp_path, "r", "op", points)
    text = "\n".join(operation_markdown(tmp_path))
    assert "| dtype | shape (from) | checked against | native | fast | fast vs native |" in text
    assert "| bf16 | M1 (given) | float64 on cpu, whole output | " in text
    assert ("| bf16 | M2 (given) | float32 on cuda + float64 host sample: 1024 of 5504 output elements (16 of 16 "
            "rows x 64 of 344 columns) | ") in text
    assert "| bf16 | M3 (given) | float32 on cuda only, no host sample [1] | " in text
    assert f"- [1] no float64 host sample: {why}" in text
    assert "| bf16 | M4 (given) | - | skipped |" in text  # skipped before a reference was computed
    entries = {e["operator"]: e for e in operator_summaries(collect_points(tmp_path))}
    column = OPERATOR_HEADER.index("checked against (point-implementation pairs)")
    assert operator_cells(entries["mm"], plain)[column] == ("float64 on cpu, whole output: 2; float32 on cuda + "
                                                            "float64 host sample: 2")
    assert operator_cells(entries["cross_entropy"], plain)[column] == (  # a record from before the reason's words
        "float32 on cuda only, no host sample: 1 (too many logits for the host's float64 pass: 1)")
    assert operator_cells({**entries["mm"], "checked": None})[column] == "-"  # a summary.json from before
    kept = {(p["shape"], p["implementation"]): p for p in entries["mm"]["points"]}
    assert kept[("M2", "fast")]["reference"] == "float32 on cuda" and kept[("M2", "fast")]["reference_sample"] == \
        sample
    assert kept[("M1", "native")]["reference_sample"] is None


def test_the_sample_takes_the_first_and_last_rows_and_windows_of_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = make_inputs(OPERATORS["mm"], {"M": 100, "N": 1000, "K": 8}, "fp32", CPU, seed=0)
    sample = host_sample(OPERATORS["mm"], "fp32", inputs, seed=3)
    rows, cols = sample.axes[0][0], sample.axes[0][1]
    assert len(rows) == sampled.ROWS and rows[0] == 0 and rows[-1] == 99 and rows == sorted(set(rows))
    assert cols[:sampled.WINDOW] == list(range(sampled.WINDOW)) and cols[-1] == 999
    assert len(cols) <= sampled.WINDOW * sampled.WINDOWS
    (ref,) = sample.reference().outputs
    assert ref.dtype == torch.float64 and ref.shape == (len(rows), len(cols))
    expected = (inputs[0].double() @ inputs[1].double())[rows][:, cols]
    assert torch.allclose(ref, expected, rtol=1e-12, atol=1e-12)
    assert sample.locate(0, (1, 2)) == [rows[1], cols[2]]
    # causal attention's sampled query rows see the keys up to their own position, as the whole call does
    dims = {"B": 1, "H": 2, "S": 40, "D": 8}
    q, k, v = make_inputs(OPERATORS["scaled_dot_product_attention"], dims, "fp32", CPU, seed=0)
    attention = host_sample(OPERATORS["scaled_dot_product_attention"], "fp32", [q, k, v], seed=0)
    whole = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    (got,) = attention.reference().outputs
    assert torch.allclose(got, attention.pick(whole)[0], rtol=1e-12, atol=1e-12)
    # cross_entropy's one mean is computed whole on the host where small enough (test_cross_entropy_...: larger)
    logits = make_inputs(OPERATORS["cross_entropy"], {"R": 4, "V": 50}, "fp32", CPU, seed=0)
    assert host_sample(OPERATORS["cross_entropy"], "fp32", logits, 0).what == "1 of 1 output elements"


def test_cross_entropy_past_one_host_copy_is_checked_whole_in_float64_from_blocks_of_rows(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable) -> None:
    """cross_entropy over 2^24 logits (a vocabulary of 128k at 2k tokens) had no host check at all: its one mean
    depends on every row. It is computed on the host in float64 from blocks of rows copied off one at a time, so a
    bug the device's reference shares is caught there too; past what the host streams through, the point says why
    it has none. (Sizes shrunk: a host copy of 100 logits, a stream of 500.)"""
    monkeypatch.setattr(sampled, "MAX_ELEMENTS", 100)
    monkeypatch.setattr(sampled, "STREAM_MAX_ELEMENTS", 500)
    op = OPERATORS["cross_entropy"]
    logits, target = make_inputs(op, {"R": 7, "V": 40}, "bf16", CPU, seed=0)
    sample = host_sample(op, "bf16", [logits, target], 0)
    assert sample.what == "1 of 1 output elements (the mean over all 7 rows, from blocks of 2 rows copied off)"
    (ref,) = sample.reference().outputs
    whole = torch.nn.functional.cross_entropy(logits.double(), target)
    assert ref.dtype == torch.float64 and ref.shape == () and torch.allclose(ref, whole, rtol=1e-12, atol=1e-12)
    # the mean is over the targets not ignored (ignore_index, as the native call's), counted block by block
    target[[0, 3, 4]] = -100
    (ignored,) = host_sample(op, "bf16", [logits, target], 0).reference().outputs
    assert torch.allclose(ignored, torch.nn.functional.cross_entropy(logits.double(), target), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(ignored, torch.nn.functional.cross_entropy(logits.double(), target, reduction="sum") / 7)
    # the sample keeps the host's value, not the device's inputs (held across every implementation of the point)
    alive = weakref.ref(logits)
    kept = host_sample(op, "bf16", [logits, target], 0)
    del logits, target
    assert alive() is None, "the sample holds the point's logits"
    assert kept.reference().outputs[0] == ignored
    # a vocabulary over one host copy (blocks are whole rows): no sample, said, rather than copies past the limit
    monkeypatch.setattr(sampled, "MAX_ELEMENTS", 30)
    with pytest.raises(NoSample, match=r"one row of them \(40\) is over the 30 logits of one host copy"):
        host_sample(op, "bf16", make_inputs(op, {"R": 7, "V": 40}, "bf16", CPU, seed=0), 0)
    monkeypatch.setattr(sampled, "MAX_ELEMENTS", 100)
    big = make_inputs(op, {"R": 13, "V": 40}, "bf16", CPU, seed=0)  # 520 logits
    with pytest.raises(NoSample, match=r"one mean over all 13 rows, which depends on every one of its 520 logits "
                                        r"\(a sample of rows would check no part of it\), and those are over the 500"):
        host_sample(op, "bf16", big, 0)

    # through the round: the device's reference shares the implementation's bug (off by 0.01); the host's finds it
    real = driver.reference_for
    monkeypatch.setattr(driver, "reference_for",
                        lambda o, d: (lambda *inputs: real(o, d)(*inputs) + 0.01))
    cfg = config(operators=["cross_entropy"], dtypes=["fp32"], models=[], shapes={"cross_entropy": [
        {"R": 7, "V": 40}, {"R": 13, "V": 40}]}, reference_cpu_max_elements=0)
    runner = _run(cfg, cpu_spec, {"shared": _implementation(lambda out, _: out + 0.01)}, device_is_host=False)
    streamed, too_big = runner.points
    assert streamed.status == "failed" and streamed.reference_sample == (
        "float64 on cpu at 1 of 1 output elements (the mean over all 7 rows, from blocks of 2 rows copied off)")
    assert "reference float64 on cpu at 1 of 1 output elements" in streamed.error, streamed.error
    assert too_big.status == "passed" and too_big.reference_sample.startswith(  # its device reference alone
        "none: too many logits for the host's float64 pass; cross_entropy's output is one mean over all 13 rows, "
        "which depends on every one of its 520 logits")


def test_the_headline_counts_why_points_have_no_host_sample_in_the_same_words_everywhere(tmp_path: Path) -> None:
    """The operator's headline (report.md, the terminal summary, the site) counted the points without a host sample
    but no longer said why (only report.md's footnotes and summary.json did: a reason carried the shape's sizes).
    Each reason now has a few words the same for every shape, before its full text; the headline counts the pairs
    per reason in those words, one function's, in all three places, and summary.json keeps the counts."""
    from starlette.testclient import TestClient
    from typer.testing import CliRunner

    from flagperf.results.operators import OPERATOR_HEADER, no_sample_reason
    from flagperf.results.schema import OperatorPoint
    from flagperf.site.app import create_app
    from flows.cli import app

    many = "too many logits for the host's float64 pass"
    with pytest.raises(NoSample) as raised:
        sampled._block_rows(1 << 20, 1 << 17)  # 2^37 logits
    assert raised.value.reason == many and str(raised.value).startswith(f"{many}; cross_entropy's output is one ")

    def point(rows: int, impl: str, sample: str) -> OperatorPoint:
        return OperatorPoint(operator="cross_entropy", group="loss", dtype="bf16", shape={"R": rows, "V": 128256},
                             source="given", implementation=impl, status="passed", reference="float32 on cuda",
                             reference_sample=sample, latency_s=1e-3, value=1.0, unit="GB/s")

    def full(rows: int) -> str:
        return f"none: {many}; cross_entropy's output is one mean over all {rows} rows, which depends on every logit"

    failed = f"none: {driver.HOST_FAILED}; CUDA out of memory. Tried to allocate 2.00 GiB"
    points = [point(rows, impl, full(rows)) for rows in (4096, 16384) for impl in ("native", "fast")]
    points += [point(512, impl, failed) for impl in ("native", "fast")]
    run = tmp_path / "run1"
    write_operation_round(run, "run1", "op-loss", points)
    done = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "400"})
    assert done.exit_code == 0, done.output
    words = f"float32 on cuda only, no host sample: 6 ({many}: 4, {driver.HOST_FAILED}: 2)"
    report = (run / "report.md").read_text(encoding="utf-8")
    headline = next(line for line in report.splitlines() if line.startswith("| op-loss | cross_entropy |"))
    column = OPERATOR_HEADER.index("checked against (point-implementation pairs)")
    assert headline.split(" | ")[column].replace("\\", "") == words, headline  # md_text's escapes dropped
    # the terminal's table wraps a cell over its lines: the column's pieces, joined
    cell = " ".join(line.split("│")[column + 1].strip() for line in done.output.splitlines()
                    if line.startswith("│") and line.count("│") == len(OPERATOR_HEADER) + 1)
    assert cell == words, done.output
    page = TestClient(create_app(tmp_path, None)).get("/runs/run1")
    assert page.status_code == 200 and f"<td>{words}</td>" in html.unescape(page.text), page.text
    (entry,) = json.loads((run / "summary.json").read_text())["operators"]
    assert entry["no_sample"] == {"float32 on cuda only, no host sample": {many: 4, driver.HOST_FAILED: 2}}
    # the footnotes keep each shape's full reason, its first words the headline's
    assert f"- [1] no float64 host sample: {full(4096).removeprefix('none: ')}" in report.replace("\\", ""), report
    # a record from before the reason had its own part: the short reason its words name, else its first clause, the
    # sizes as N (one count, not one a shape); "; " inside an older text is no short reason
    preamble = ("cross_entropy's output is one mean over all 4096 rows, which depends on every one of its 525336576 "
                "logits (a sample of rows would check no part of it), and ")
    assert no_sample_reason(f"{preamble}those are over the 4294967296 the host computes in float64 block by block "
                            "(the point's reference is the device's own kernels alone)") == many
    assert no_sample_reason(f"{preamble}one row of them (300000) is over the 268435456 logits of one host copy, the "
                            "blocks being whole rows (the point's reference is the device's own kernels alone)") \
        == "one row of logits over a host copy"
    assert no_sample_reason("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
                            "10.53 GiB already allocated)") == ("CUDA out of memory. Tried to allocate N MiB (GPU N; "
                                                                "N GiB total capacity; N GiB already allocated)")
    assert no_sample_reason("none defined for fp8_gemm; no host sample is defined for fp8_gemm") == \
        "none defined for fp8_gemm"
    # the oldest record of an operator without a host sample counts with the new ones of that operator
    assert no_sample_reason("no host sample is defined for fp8_gemm") == "none defined for fp8_gemm"
    # each size of a product and an address are numbers; a name's digits (fp8_gemm, bf16, float64, M4096) are not
    assert no_sample_reason("mat1 and mat2 shapes cannot be multiplied (4096x128256 and 160x4096)") == \
        "mat1 and mat2 shapes cannot be multiplied (NxN and NxN)"
    assert no_sample_reason("bad pointer 0x7f3a9c000000 from triton 3.1.0") == "bad pointer N from triton N"
    assert no_sample_reason("fp8_gemm in bf16 over float64 at M4096xN4096") == \
        "fp8_gemm in bf16 over float64 at M4096xN4096"


def test_the_sample_of_a_huge_dimension_is_drawn_without_a_permutation_of_it(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    """A dimension goes up to 2^31 - 1: a permutation of it to draw 14 rows (torch.randperm) took 16 GiB of host
    memory. The draw takes memory for the rows alone, and the same seed draws the same rows."""

    def no_permutation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a permutation of {args[0]} drawn")

    monkeypatch.setattr(torch, "randperm", no_permutation)
    n = 2**31 - 1

    def draw(seed: int) -> list[int]:
        gen = torch.Generator()
        gen.manual_seed(seed)
        return sampled.spread(n, sampled.ROWS, gen)

    rows = draw(5)
    assert len(rows) == sampled.ROWS and rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == n - 1
    assert rows == draw(5) and rows != draw(6)
    gen = torch.Generator()
    assert sampled.spread(5, 16, gen) == [0, 1, 2, 3, 4] and sampled.spread(5, 2, gen) == [0, 4]


# ------------------------------------------------------------------ the timed calls' output is checked


def test_the_timed_calls_output_is_checked_not_only_the_first_calls(cpu_spec: SpecTable) -> None:
    """An implementation right on its first call and wrong after it (a graph replaying other work, a cache of
    another shape's kernel) passed: only the first call was checked. The last timed iteration's output is checked
    too: the call that was timed is the call that was checked."""
    def stale(output: Any, call: int) -> Any:
        return output if call == 1 else _last_element_off(output, call)

    cfg = config(operators=["add", "softmax"], flush_cache=True)
    runner = _run(cfg, cpu_spec, {"native": _implementation(lambda out, _: out), "stale": _implementation(stale)})
    by = {(p.operator, p.implementation): p for p in runner.points}
    for op in ("add", "softmax"):
        assert by[(op, "native")].status == "passed"
        point = by[(op, "stale")]
        assert point.status == "failed" and point.metric is None
        assert point.error.startswith("the last timed iteration's output is wrong though the first call's was "
                                      "right: wrong result: 1 of "), point.error
        # the errors beside `failed` are the wrong output's (its last element off by 1), not the first call's
        assert point.max_abs_error == pytest.approx(1.0, rel=1e-3), point.max_abs_error
        assert by[(op, "native")].max_abs_error < 1e-3
    assert not [m for m in runner.metrics if m.name.endswith("@stale")]


def test_the_timed_output_is_checked_before_the_host_loop_calls_again(cpu_spec: SpecTable) -> None:
    """An implementation whose next call writes over its previous output's memory (a reused output buffer, a
    CUDA graph tree's next run; a graph tree's stale output even raises when read) is right on every call it
    returns. Its last timed output was checked after the host loop's calls had overwritten it, which failed a
    correct implementation: it is checked before them."""

    class Overwritten(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            previous: list[torch.Tensor] = []

            def fn(*inputs: Any) -> Any:
                for out in previous:  # the memory the last output lies in, taken by this run
                    out.fill_(float("nan"))
                previous[:] = [native(*inputs)]
                return previous[0]
            return fn

    runner = _run(config(operators=["add"], min_iters=4, max_iters=4),
                  cpu_spec, {"overwritten": Overwritten(ImplEnv(device=CPU, log=logging.getLogger("test")))})
    (point,) = runner.points
    assert point.status == "passed" and point.host_latency_s is not None, point.error


def test_the_retry_without_the_rewarm_does_not_hold_the_outputs_that_did_not_fit(cpu_spec: SpecTable) -> None:
    """Out of memory with the CPU's rewarm: the point is timed again without it. The retry ran inside the except
    block, whose exception's traceback held the timer's frame and in it the rewarm's output: the memory that had
    not fitted stayed taken through the retry. No output of before is alive when the retry calls."""
    refs: list[weakref.ref[torch.Tensor]] = []
    alive_at_retry: list[int] = []

    class OutOfMemoryOnce(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            def fn(*inputs: Any) -> Any:
                number = len(refs) + 1  # 1: the check, 2: the first rewarm, 3: the call after it
                if number == 3:
                    refs.append(weakref.ref(torch.empty(0)))  # counted, never alive
                    raise RuntimeError("out of memory (allocating the timed call's output)")
                if number == 4:  # the retry's first call
                    alive_at_retry.append(sum(ref() is not None for ref in refs))
                out = native(*inputs)
                refs.append(weakref.ref(out))
                return out
            return fn

    runner = _run(config(operators=["add"], flush_cache=True), cpu_spec,
                  {"oom": OutOfMemoryOnce(ImplEnv(device=CPU, log=logging.getLogger("test")))})
    (point,) = runner.points
    assert point.status == "passed" and point.rewarmed is False, point.error
    assert alive_at_retry == [0]


def test_the_timer_hands_back_the_output_of_the_last_timed_iteration() -> None:
    """time_iterations hands back the last timed step's output (a graph's replay returns the output its capture
    allocated, so the same path hands back a replay's) and calls nothing after it; time_host's loop comes apart."""
    count = [0]
    last: list[Any] = []

    def call() -> int:
        count[0] += 1
        return count[0]

    options = TimingOptions(0.001, 10.0, 4, 4, False, True)
    timed = time_iterations(call, CPU, options, None, last_output=last)
    assert last == [timed.warmup_calls + 4] == count and timed.host_latency is None and timed.host_calls == 0
    hosted = time_host(call, CPU, options, timed)
    assert count[0] == timed.warmup_calls + 4 + hosted.host_calls and hosted.host_calls == 4
    assert hosted.latencies == timed.latencies and hosted.host_latency is not None


def test_the_timed_output_is_compared_outside_the_implementations_scope(cpu_spec: SpecTable) -> None:
    """A library that patches torch's operators does it in its scope (FlagGems' use_gems), which is around its
    calls, never around the comparison: there a wrong subtraction kernel of its own would hide its own wrong
    output. Here the scope's subtraction returns zeros: the wrong timed output is still found."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ZeroSubtraction(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            return torch.zeros_like(out) if func is torch.ops.aten.sub.Tensor else out

    def stale(output: Any, call: int) -> Any:
        return output if call == 1 else _last_element_off(output, call)

    patched = _implementation(stale)
    patched.scope = ZeroSubtraction  # type: ignore[method-assign]
    runner = _run(config(operators=["mul"]), cpu_spec, {"patched": patched})
    (point,) = runner.points
    assert point.status == "failed" and point.error.startswith("the last timed iteration's output is wrong"), \
        point.error


# ------------------------------------------------------------------ energy: the calls and nothing else


def flush_times(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The wall-clock time of each cache flush from now on (appended as each one ends)."""
    flushed: list[float] = []
    real = CacheFlush.__call__

    def recorded(self: CacheFlush) -> None:
        real(self)
        flushed.append(time.time())

    monkeypatch.setattr(CacheFlush, "__call__", recorded)
    return flushed


def test_the_energy_window_holds_the_calls_and_no_flush(monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable
                                                        ) -> None:
    """Energy per work was the monitors' energy over the timed loop's window / its work, whose cache flushes (and on
    the CPU, the rewarm calls) took most of it and were charged to the calls. It is taken over the metric's
    energy_window, the host loop's (the calls back to back and nothing else) / energy_work, theirs; window and work
    stay the timed iterations' (what the figure, the chip's state and the timeline are of: rate = work /
    measured_seconds)."""
    flushed = flush_times(monkeypatch)
    cfg = config(operators=["add"], flush_cache=True, min_iters=4, max_iters=4)
    runner = PointRunner(cfg, cpu_spec, CPU, load_implementations(cfg, "cpu", CPU))
    (planned,) = plan_points(cfg)
    runner.run(planned)
    (point,), (metric,) = runner.points, runner.metrics
    assert point.status == "passed" and len(flushed) >= 5
    assert metric.energy_window is not None
    start, end = metric.energy_window
    assert start < end and not [t for t in flushed if start <= t <= end], (metric.energy_window, flushed)
    timed_start, timed_end = metric.window
    assert len([t for t in flushed if timed_start <= t <= timed_end]) == 4 and timed_end <= start
    _, nbytes = counted(planned.op, planned.dims, planned.dtype)
    calls = max(1, min(4, math.ceil(cfg.rep_s / point.latency_s)))  # the host loop's count (timer.time_host)
    assert metric.energy_work == pytest.approx(nbytes * calls / 1e9)
    assert metric.work == pytest.approx(nbytes * 4 / 1e9) and metric.iterations == 4
    assert (f"window and work: the 4 timed iterations (cache flushes between them); energy per work over "
            f"energy_window, the {calls} calls of the host loop (back to back, no flush), / their work") in metric.note


def test_the_energy_loop_lasts_the_monitor_intervals_asked_whatever_max_iters(
        monkeypatch: pytest.MonkeyPatch, cpu_spec: SpecTable, tmp_path: Path) -> None:
    """The host loop is capped by max_iters and rep_s: a few ms, under one monitor interval even at the fastest
    (0.1 s), so its energy per work was the interpolated power of the interval around it. energy_intervals asks for
    a loop of the calls back to back over that many of the monitors' intervals (the round is told the interval),
    with no count cap and no flush, which energy per work is taken over: samples every interval, at any phase,
    put 2 or more inside it. Without the interval the round says it ran none."""
    flushed = flush_times(monkeypatch)
    cfg = config(operators=["add"], flush_cache=True, min_iters=2, max_iters=3, energy_intervals=3)
    outcome = driver.run_operation(cfg, "cpu", cpu_spec, CPU, monitor_interval_s=0.1)
    (point,), (metric,) = outcome.report.points, outcome.metrics
    assert point.status == "passed" and point.host_latency_s is not None and point.note is None, point.error
    assert outcome.report.energy == "0.3 s: energy_intervals 3 x the monitors' 0.1 s interval"
    found = re.search(r"energy per work over energy_window, the (\d+) calls of the energy loop \(0\.3 s: "
                      r"energy_intervals 3 x the monitors' 0\.1 s interval\) \(back to back, no flush\), / their "
                      r"work", metric.note or "")
    assert found, metric.note
    calls = int(found.group(1))
    assert metric.energy_window is not None and metric.energy_work is not None
    start, end = metric.energy_window
    assert end - start >= 0.3 and metric.window[1] <= start and not [t for t in flushed if start <= t <= end]
    assert calls > cfg.max_iters and metric.energy_work == pytest.approx(point.bytes * calls / 1e9)
    assert metric.work == pytest.approx(point.bytes * point.iterations / 1e9)  # the timed iterations', as before
    # a counter every 0.1 s at an arbitrary phase, 50 W: the figure rests on the samples inside the loop
    samples = [{"t": start - 1.0 + 0.037 + i / 10, "energy_j": 5.0 * i} for i in range(int((end - start) * 10) + 21)]
    (row,) = _summarized(tmp_path, [metric], {"system": samples}).rows.to_dict("records")
    assert row["energy_per_work_samples"] >= 2 and pd.isna(row["energy_per_work_note"])
    assert row["energy_per_work"] == pytest.approx(50.0 * (end - start) / metric.energy_work)
    (line, *_) = method_lines([_round(outcome.report)])
    assert "; energy loop: 0.3 s: energy_intervals 3 x the monitors' 0.1 s interval" in line, line
    # not told the interval (a round run outside flagperf run): no energy loop, said; the host loop's window
    untold = driver.run_operation(cfg, "cpu", cpu_spec, CPU)
    assert untold.report.energy.startswith("not run: energy_intervals 3 is in monitor intervals, and this round "
                                           "was not told the monitors' interval")
    assert "calls of the host loop (back to back, no flush)" in (untold.metrics[0].note or "")
    # the metric says its energy_window is the energy loop (a note on too few samples then says it ran)
    assert metric.energy_intervals == 3 and metric.energy_loop_ran is True
    assert (untold.metrics[0].energy_intervals, untold.metrics[0].energy_loop_ran) == (3, False)


def test_energy_intervals_is_checked_and_a_loop_past_the_timeout_is_one_line(cpu_spec: SpecTable) -> None:
    for value, message in ((2, "must be 0 (no energy loop) or 3 to 100 monitor intervals (got 2): a shorter loop "
                                "may hold fewer than 2 monitor samples"),
                           (101, "(got 101)"), (True, "valid integer")):
        with pytest.raises(ValidationError) as caught:
            config(energy_intervals=value)
        error = pydantic_error_to_config_error(caught.value, "cases/operation/op-elementwise/case.yaml")
        assert "\n" not in str(error) and message in str(error) and error.key == "energy_intervals", str(error)
    assert config().energy_intervals == 0  # off unless asked: CI's rounds and the shipped cases run none
    with pytest.raises(CaseUserError) as info:
        driver.run_operation(config(energy_intervals=10, timeout_s=20), "cpu", cpu_spec, CPU, monitor_interval_s=2.0,
                             energy_origin="my.yaml")
    assert str(info.value) == ("my.yaml: energy_intervals: 10 x the monitors' 2 s interval = 20 s per point, with "
                               "warmup_s + 2 x rep_s, must be well below timeout_s (20): fewer intervals, a shorter "
                               "--monitor-interval or a longer timeout_s")


def _round(report: OperationReport) -> RoundResult:
    now = datetime.now(timezone.utc)
    return RoundResult(run_id="run-r", case="op", family="operation", round=1, host="h1", node_rank=0, vendor="cpu",
                       status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0,
                       config={}, operation=report)


class _OutOfMemoryInHostPhases(OperatorImplementation):
    """Runs out of memory in the host phases (its third scope: the check, the timed phase, then the host and energy
    loops) from the call numbered ``from_call`` of that scope on."""

    def __init__(self, from_call: int) -> None:
        super().__init__(ImplEnv(device=CPU, log=logging.getLogger("test")))
        self.from_call = from_call
        self.scopes = 0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        self.scopes += 1
        yield

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        calls = [0]

        def fn(*inputs: Any) -> Any:
            if self.scopes == 3:
                calls[0] += 1
                if calls[0] >= self.from_call:
                    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return native(*inputs)
        return fn


def test_out_of_memory_in_the_host_loop_keeps_the_passed_point_without_its_host_figures(cpu_spec: SpecTable
                                                                                         ) -> None:
    """A point checked and timed, whose host loop then ran out of memory, was skipped as "does not fit in memory":
    its figure was lost. It is recorded with no host latency and a note, its metric with no energy per work (no
    loop of its calls alone ran) and saying why; the energy loop running out keeps the host loop's."""
    cfg = config(operators=["add"], min_iters=3, max_iters=3, rep_s=1.0, energy_intervals=3)
    runner = PointRunner(cfg, cpu_spec, CPU, Implementations(ready={"host": _OutOfMemoryInHostPhases(1),
                                                                    "energy": _OutOfMemoryInHostPhases(4)}),
                         monitor_interval_s=0.1)
    (planned,) = plan_points(cfg)
    runner.run(planned)
    by = {p.implementation: p for p in runner.points}
    metrics = {m.name.rsplit("@", 1)[1]: m for m in runner.metrics}
    host, energy = by["host"], by["energy"]
    assert host.status == "passed" and host.latency_s and host.host_latency_s is None, host.error
    assert host.note == ("the host loop ran out of memory (RuntimeError: CUDA out of memory. Tried to allocate 2.00 "
                         "GiB): no host latency, and no energy per work (no loop of the calls alone ran)")
    assert metrics["host"].energy_window is None and metrics["host"].energy_per_work_absent.startswith(
        "operation: its host loop ran out of memory")
    assert host.note in (metrics["host"].note or "")
    assert energy.status == "passed" and energy.host_latency_s is not None, energy.error
    assert energy.note.startswith("the energy loop ran out of memory (") and energy.note.endswith(
        "): energy per work over the host loop instead")
    assert "the 3 calls of the host loop (back to back" in (metrics["energy"].note or "")
    assert metrics["energy"].energy_per_work_absent is None
    # the case's energy_intervals rides with the figure, with whether its loop ran (a summary then never asks for it)
    assert (metrics["energy"].energy_intervals, metrics["energy"].energy_loop_ran) == (3, False)
    # the report's lines on how the case was measured say which points lack what
    lines = method_lines([_round(OperationReport(timing="-", flush="-", graphs="-", counting={}, tolerances={},
                                                 points=runner.points))])
    assert "  - add fp32 R16xC128 @host: the host loop ran out of memory (RuntimeError: CUDA out of memory. Tried " \
           "to allocate 2.00 GiB): no host latency, and no energy per work (no loop of the calls alone ran)" in lines


T0 = 1_800_000_000.0


def _summarized(tmp_path: Path, metrics: list[Any], monitors: dict[str, list[dict[str, Any]]]) -> Any:
    """summarize() of one round of ``metrics`` with these monitors' samples beside it."""
    from flagperf.results.schema import write_result
    from flagperf.results.summary import summarize

    now = datetime.now(timezone.utc)
    folder = tmp_path / "run-e" / "op" / "round1" / "h1_noderank0"
    write_result(folder / "result.json", RoundResult(
        run_id="run-e", case="op", family="operation", round=1, host="h1", node_rank=0, vendor="cpu",
        status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0, metrics=metrics,
        config={}))
    for name, samples in monitors.items():
        (folder / f"monitor_{name}.jsonl").write_text("\n".join(
            [json.dumps({"type": "header", "monitor": name, "interval_s": 1.0})]
            + [json.dumps({"type": "sample", **s}) for s in samples]) + "\n")
    return summarize(tmp_path / "run-e")


def test_energy_per_work_rests_on_two_samples_inside_its_window_or_is_left_out_saying_why(tmp_path: Path) -> None:
    """Energy per work over energy_window / energy_work (operation's loop), else window / work. Under 2 samples of
    the energy source inside that window, the energy was interpolated between samples around it (the interval's
    average power: the flushed timed loop, the next point's set-up) and published: now it is left out, each row
    saying why (energy_per_work_note) and the round's notes counting them. A window the samples do not reach is
    said too (it vanished silently). Over an energy_window (calls back to back at a steady rate) the figure is the
    mean power between the samples inside it, none from outside; the sample count and the unit go with a figure
    only (a row without work had them)."""
    from flagperf.results.schema import Metric

    # 100 W from T0 to T0 + 10, then 400 W: a counter sampled every second, then every tenth of a second to T0 + 12
    samples = [{"t": T0 + i, "energy_j": 100.0 * i} for i in range(11)]
    samples += [{"t": T0 + 10 + i / 10, "energy_j": 1000.0 + 40.0 * i} for i in range(1, 21)]

    def metric(name: str, **fields: Any) -> Metric:
        return Metric(name=name, value=1.0, unit="GB/s", **{"window": [T0 + 1, T0 + 5], "work": 8.0, **fields})

    summary = _summarized(tmp_path, [
        metric("wide", energy_window=[T0 + 6, T0 + 8], energy_work=2.0),  # 200 J / 2 GB; 3 samples inside
        metric("narrow", energy_window=[T0 + 2.25, T0 + 2.5], energy_work=0.5),  # none inside
        # 400 W between its first and last samples inside (T0 + 10 to + 10.5); interpolated, its first half second
        # would be the 100 W before it: 270 J, not 420 J
        metric("edge", energy_window=[T0 + 9.5, T0 + 10.55], energy_work=1.05),
        metric("late", energy_window=[T0 + 20, T0 + 21], energy_work=1.0),  # after the last sample
        metric("plain"),  # no energy_window: over window / work, 400 J / 8 GB
        metric("short", window=[T0 + 3.2, T0 + 3.7], work=1.0),  # a timed region between two samples
        metric("no-work", work=None)], {"system": samples})
    rows = {r["metric"]: r for r in summary.rows.to_dict("records")}

    def column(name: str) -> dict[str, Any]:
        return {metric: None if pd.isna(row[name]) else row[name] for metric, row in rows.items()}

    assert column("energy_per_work") == pytest.approx({"wide": 100.0, "narrow": None, "edge": 400.0, "late": None,
                                                       "plain": 50.0, "short": None, "no-work": None})
    assert column("energy_per_work_samples") == {"wide": 3, "narrow": None, "edge": 6, "late": None, "plain": 5,
                                                 "short": None, "no-work": None}
    assert column("energy_per_work_unit") == {"wide": "J/GB", "narrow": None, "edge": "J/GB", "late": None,
                                              "plain": "J/GB", "short": None, "no-work": None}
    assert column("energy_per_work_note") == {
        "wide": None, "edge": None, "plain": None, "no-work": None,
        "narrow": "0 sample(s) of the cpu packages energy inside the 0.25 s energy window, 2 needed; operation: set "
                  "energy_intervals",
        "late": "the monitors' cpu packages samples do not cover the energy window (a monitor started late or "
                "stopped early)",
        "short": "0 sample(s) of the cpu packages energy inside the 0.5 s timed region, 2 needed"}
    notes = [n for n in summary.monitor_notes if "energy per work" in n]
    assert notes == [
        "op round 1 on h1: energy per work of 2 of 6 figures left out (energy_per_work_note): fewer than 2 samples of "
        "the energy source inside the window it is over (0.25 s at the shortest), whose energy would be the average "
        "power of the interval around it, not the window's own; operation: set the case's energy_intervals (a loop of "
        "each point's calls over that many monitor intervals); elsewhere sample faster (--monitor-interval, down to "
        "0.1 s)",
        "op round 1 on h1: energy per work of 1 of 6 figures left out (energy_per_work_note): the monitors' samples "
        "do not cover the window it is over (a monitor that started late or stopped early)"], notes


def test_too_few_samples_in_an_energy_loop_that_ran_says_so_and_does_not_ask_for_energy_intervals(
        tmp_path: Path) -> None:
    """Too few samples inside operation's energy window said "set energy_intervals" even where energy_intervals was
    set and the energy loop ran: the note says the loop ran and how many samples it held, and asks for a longer loop
    or a shorter monitor interval; over the host loop it still asks for energy_intervals."""
    from flagperf.results.schema import Metric

    samples = [{"t": T0 + i, "energy_j": 100.0 * i} for i in range(11)]  # every second: a slow energy source
    summary = _summarized(tmp_path, [
        Metric(name="loop", value=1.0, unit="GB/s", window=[T0 + 1, T0 + 2], work=1.0,
               energy_window=[T0 + 2.1, T0 + 3.05], energy_work=1.0, energy_intervals=3),  # 1 sample inside
        Metric(name="host", value=1.0, unit="GB/s", window=[T0 + 1, T0 + 2], work=1.0,
               energy_window=[T0 + 4.1, T0 + 4.2], energy_work=1.0),
        # energy_intervals set, but its loop did not run (out of memory): over the host loop, and not asked to set it
        Metric(name="fell", value=1.0, unit="GB/s", window=[T0 + 1, T0 + 2], work=1.0,
               energy_window=[T0 + 5.1, T0 + 5.2], energy_work=1.0, energy_intervals=3, energy_loop_ran=False)],
        {"system": samples})
    rows = {r["metric"]: r for r in summary.rows.to_dict("records")}
    assert rows["loop"]["energy_per_work_note"] == (
        "1 sample(s) of the cpu packages energy inside the 0.95 s energy window, 2 needed; operation: the energy loop "
        "ran (energy_intervals 3) and held 1 sample(s): a longer loop (more energy_intervals) or a shorter "
        "--monitor-interval")
    assert rows["host"]["energy_per_work_note"].endswith("2 needed; operation: set energy_intervals")
    assert rows["fell"]["energy_per_work_note"].endswith("2 needed; operation: over the host loop, the energy loop "
                                                         "(energy_intervals 3) having not run for it (the point's "
                                                         "note, or the round's energy loop line where the round was "
                                                         "not told the monitors' interval, says why)")
    notes = [n for n in summary.monitor_notes if "energy per work" in n]
    assert "op round 1 on h1: energy per work of 1 of 3 figures left out (energy_per_work_note): fewer than 2 " \
           "samples of the energy source inside the host loop they fell back to, their energy loop " \
           "(energy_intervals) not having run (each point's note, or the round's energy loop line where the round " \
           "was not told the monitors' interval, says why)" in notes, notes
    notes.remove(next(n for n in notes if "fell back" in n))
    assert len(notes) == 2 and notes[0].endswith("operation: set the case's energy_intervals (a loop of each point's "
                                                 "calls over that many monitor intervals); elsewhere sample faster "
                                                 "(--monitor-interval, down to 0.1 s)"), notes
    assert notes[1] == (
        "op round 1 on h1: energy per work of 1 of 3 figures left out (energy_per_work_note): operation's energy loop "
        "ran (energy_intervals) and still held fewer than 2 samples of the energy source (0.95 s at the shortest) (its "
        "samples further apart than the monitors' interval): a longer loop (more energy_intervals) or a shorter "
        "--monitor-interval"), notes


def test_energy_per_work_is_of_the_source_the_energy_beside_it_names(tmp_path: Path) -> None:
    """energy_source names where energy_j (over the timed region) came from; energy per work over the energy window
    took the most preferred source there, which could be another (an accelerator monitor that started late), so the
    row named one source and gave the other's figure. It is of the source energy_source names."""
    from flagperf.results.schema import Metric

    packages = [{"t": T0 + i, "energy_j": 50.0 * i} for i in range(11)]  # 50 W, every second
    accelerator = [{"t": T0 + 5.5 + i / 10, "devices": [{"index": 0, "power_w": 300.0}]} for i in range(30)]
    summary = _summarized(tmp_path, [
        Metric(name="m", value=1.0, unit="GB/s", window=[T0 + 1, T0 + 5], work=8.0, energy_window=[T0 + 6, T0 + 8],
               energy_work=2.0)], {"system": packages, "nvidia": accelerator})
    (row,) = summary.rows.to_dict("records")
    assert row["energy_source"] == "cpu packages" and row["energy_j"] == pytest.approx(200.0)
    assert row["energy_per_work"] == pytest.approx(50.0)  # 100 J / 2 GB, not the accelerator's 600 J / 2 GB


def test_a_window_that_is_not_start_then_end_makes_the_result_unreadable_not_the_summary_crash(tmp_path: Path
                                                                                                ) -> None:
    """The analysis reads window and energy_window as (start, end): a record with one number in it raised
    IndexError in the summary, and an end before its start gave a negative energy. Both are unreadable results,
    one line each naming the key; energy_window without energy_work (or the other way) too."""
    from flagperf.results.schema import Metric
    from flagperf.results.summary import summarize

    now = datetime.now(timezone.utc)
    good = RoundResult(run_id="run-w", case="op", family="operation", round=1, host="h1", node_rank=0, vendor="cpu",
                       status="success", started_at=now, finished_at=now, duration_s=1.0, measured_seconds=1.0,
                       metrics=[Metric(name="m", value=1.0, unit="GB/s", window=[T0, T0 + 1], work=1.0)], config={})
    record = json.loads(good.model_dump_json())
    broken = {"h1": {"energy_window": [T0], "energy_work": 1.0}, "h2": {"window": [T0 + 1, T0]},
              "h3": {"energy_window": [T0, T0 + 1, T0 + 2], "energy_work": 1.0},
              "h4": {"energy_window": [T0, T0 + 1]}, "h5": {}}
    for host, fields in broken.items():
        folder = tmp_path / "run-w" / "op" / "round1" / f"{host}_noderank0"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({**record, "host": host,
                                                         "metrics": [{**record["metrics"][0], **fields}]}))
    summary = summarize(tmp_path / "run-w")
    assert list(summary.rows["host"]) == ["h5"]
    assert len(summary.problems) == 4 and all("unreadable result (metrics.0: " in p for p in summary.problems)
    assert "energy_window must be [start, end] with start <= end, got [" in summary.problems[0]
    assert "window must be [start, end] with start <= end, got [" in summary.problems[1]
    assert "energy_window and energy_work go together" in summary.problems[3]


def test_the_host_window_encloses_the_host_loops_calls_and_no_flush() -> None:
    events: list[tuple[str, float]] = []

    def call() -> None:
        events.append(("call", time.time()))

    timed = time_call(call, CPU, TimingOptions(0.001, 10.0, 3, 3, True, False),
                      lambda: events.append(("flush", time.time())))
    assert timed.host_window is not None and timed.host_calls == 3
    start, end = timed.host_window
    inside = [kind for kind, t in events if start <= t <= end]
    assert inside == ["call"] * 3, events[-8:]


# ------------------------------------------------------------------ counting: the bytes a call moves


def test_rotary_counts_the_cos_and_sin_rows_its_tokens_read_not_the_whole_table() -> None:
    """A decode step's rotary reads one cos and one sin row (D/2 each) per token at its position; the whole
    table (S rows) was counted: at T 1, S 4096 the figure was mostly bytes no one moved. An indexed read counts a
    row per index, as embedding's and index_select's do; the whole table is what the point allocates."""
    rotary = OPERATORS["rotary"]
    dims = {"T": 1, "H": 32, "KVH": 8, "D": 128, "S": 4096}
    assert counted(rotary, dims, "bf16")[1] == 2 * 2 * 1 * 128 * (32 + 8) + 2 * 1 * 128 + 8 * 1
    assert rotary.allocated_bytes(dims, 2) == 2 * 2 * 1 * 128 * (32 + 8) + 2 * 4096 * 128 + 8 * 1
    embedding = counted(OPERATORS["embedding"], {"V": 4096, "C": 64, "T": 1}, "bf16")[1]
    assert embedding == 8 + 2 * 2 * 64  # the same convention: the rows the indices name, read once each
    # fp8 mm reads its two fp32 scales too
    assert counted(OPERATORS["mm"], {"M": 2, "N": 3, "K": 4}, "fp8")[1] == 8 + 12 + 2 * 6 + 8
    # rotary's positions repeat every S tokens (FlagGems' T = 4S): each index read counts its row, as the docs say
    dims = {"T": 512, "H": 8, "KVH": 1, "D": 64, "S": 128}
    assert counted(rotary, dims, "fp16")[1] == 2 * 2 * 512 * 64 * 9 + 2 * 512 * 64 + 8 * 512
    docs = " ".join((ROOT / "docs" / "operation.md").read_text(encoding="utf-8").split())
    assert "counts **one row (or element) per index read**" in docs and "counted so (FlagGems' RopeBenchmark" in docs
    for name, op in OPERATORS.items():  # every formula as the docs write it, operator by operator
        assert name in (ROOT / "docs" / "operation.md").read_text(encoding="utf-8")
        assert op.formula().startswith(("FLOPs = ", "FLOPs not counted"))


# ------------------------------------------------------------------ the flaggems-core shape set


def test_flaggems_core_has_valid_shapes_for_every_operator_from_flaggems_own_lists() -> None:
    core = SHAPE_SETS["flaggems-core"]
    assert set(core) == set(OPERATORS)
    for name, shapes in core.items():
        assert shapes, name
        for dims, source in shapes:
            assert OPERATORS[name].check_dims(dims) is None, (name, dims)
            assert tuple(dims) == OPERATORS[name].dims and source.startswith("flaggems-core "), (name, dims, source)
    def dims(name: str) -> list[dict[str, int]]:
        return [d for d, _ in core[name]]

    # BlasBenchmark's [B, M, N, K]: mm drops B (4 distinct shapes of 5), bmm keeps it
    assert dims("mm") == [{"M": 384, "N": 384, "K": 384}, {"M": 4096, "N": 4096, "K": 4096},
                          {"M": 1024, "N": 1024, "K": 1024}, {"M": 2048, "N": 2048, "K": 2048}]
    assert len(dims("bmm")) == 5 and dims("bmm")[0] == {"B": 2, "M": 384, "N": 384, "K": 384}
    assert dims("scaled_dot_product_attention")[-1] == {"B": 4, "H": 32, "S": 8192, "D": 128}
    # reductions over dimension 1 of [64, 512, 512]: 32768 rows of 512; a 1-D shape is one row
    assert {"R": 32768, "C": 512} in dims("softmax") and {"R": 1, "C": 1048576} in dims("sum")
    assert {"R": 20, "C": 6 * 65536} in dims("layer_norm")  # everything after dimension 0 normalised
    assert {"R": 1, "C": 1073741824} in dims("add")
    assert {"R": 64, "C": 512 * 512} in dims("cat") and all(d["R"] * d["C"] <= 2**29 for d in dims("cat"))
    assert {"R": 4096, "C": 4096, "T": 409} in dims("index_select") and {"R": 64, "C": 64, "G": 128} in dims("gather")
    assert dims("rotary")[0] == {"T": 4 * 128, "H": 8, "KVH": 1, "D": 64, "S": 128}


def test_a_case_selects_the_shape_set_and_a_wrong_name_is_one_line() -> None:
    cfg = config(operators=["mm", "add"], models=[], shape_sets=["flaggems-core"],
                 shapes={"mm": [{"M": 384, "N": 384, "K": 384}, {"M": 3, "N": 5, "K": 7}]})
    planned = [(p.op.name, p.source, p.shape_set) for p in plan_points(cfg)]
    # the set's first, the given 384s met again and measured once, then the given 3x5x7
    assert planned[0] == ("mm", "flaggems-core BlasBenchmark [2, 384, 384, 384]", "flaggems-core")
    assert [p for p in planned if p[0] == "mm"][-1] == ("mm", "given", None)
    assert len([p for p in planned if p[0] == "mm"]) == 5 and len([p for p in planned if p[0] == "add"]) == 5
    for value, message in ((["gems-core"], "unknown shape set 'gems-core' (known: flaggems-core)"),
                           (["flaggems-core", "flaggems-core"], "a shape set is listed twice")):
        with pytest.raises(ValidationError) as caught:
            config(shape_sets=value)
        error = pydantic_error_to_config_error(caught.value, "cases/operation/op-elementwise/case.yaml")
        line = str(error)
        assert "\n" not in line and message in line and error.key.startswith("shape_sets"), line
    with pytest.raises(ValidationError, match="a named shape set"):
        config(models=[], shapes={})


def test_the_shape_set_through_set_and_the_hosts_memory_check() -> None:
    """`--set shape_sets=[flaggems-core]` as a user gives it: planned, then held against each host's memory like
    every other size, the line naming the key (FlagGems' 2**30-element add takes 12 GiB in fp32)."""
    plan = plan_run(cases=["op-elementwise"], vendor="nvidia", results_dir="/nonexistent-results",
                    sets=["shape_sets=[flaggems-core]", "models=[]", "dtypes=[fp32]", "op-elementwise.operators=[add]"])
    (case,) = plan.cases
    assert case.config["shape_sets"] == ["flaggems-core"]
    probe = {"device_visible": True, "device_count": 8, "device": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 8 * 2**30}})
    assert str(info.value).startswith(
        "--set: op-elementwise.shape_sets: add R1xC1073741824 in fp32 (flaggems-core BinaryPointwiseBenchmark "
        "[1073741824]; its inputs and output, and the cache flush's 256 MiB buffer: flush_cache: false leaves it out) "
        "needs 12.25 GiB, more than 80% of the 8.00 GiB on host gpu1"), \
        info.value
    check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 141 * 2**30}})
    # the flush is taken on each host's device: twice a memory-side cache its probe's spec table declares (an
    # MI300X's 256 MiB Infinity Cache) where that is more than 256 MiB; 12.25 GiB fits in 80% of 15.35 GiB, 12.5 not
    near = int(15.35 * 2**30)
    check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": near}})
    side = {"memory_side_cache": {"value": 256.0, "unit": "MiB", "source": "the datasheet"}}
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": near, "peaks": side}})
    assert ("and the cache flush's 512 MiB buffer (twice the memory-side cache of the vendor's spec table): "
            "flush_cache: false leaves it out) needs 12.50 GiB") in str(info.value), info.value
    # where the device is the host's CPU, its flush (twice the last-level cache) is not an accelerator's 256 MiB:
    # 12 GiB of inputs and output fit in 80% of 15.05 GiB
    cpu_plan = plan_run(cases=["op-elementwise"], vendor="cpu", results_dir="/nonexistent-results",
                        sets=["shape_sets=[flaggems-core]", "models=[]", "dtypes=[fp32]",
                              "op-elementwise.operators=[add]"])
    cpu_probe = {"device_visible": True, "device_count": 1, "device_memory_bytes": int(15.05 * 2**30)}
    check_capacity(cpu_plan, ["cpu1"], {"cpu1": cpu_probe})
    with pytest.raises(ConfigError) as info:
        check_capacity(cpu_plan, ["cpu1"], {"cpu1": {**cpu_probe, "device_memory_bytes": 14 * 2**30}})
    assert "its inputs and output alone: the cache flush's buffer, twice the host's last-level cache, is left to " \
        "the share kept free) needs 12.00 GiB" in str(info.value), info.value
    with pytest.raises(ConfigError, match="unknown shape set 'core'"):
        plan_run(cases=["op-elementwise"], vendor="nvidia", results_dir="/nonexistent-results",
                 sets=["shape_sets=[core]"])


# ------------------------------------------------------------------ the device plug-in's contract


def test_the_operation_family_never_branches_on_a_device_name() -> None:
    """What a device can do is asked of its torch module (flagperf.measure.device: device_module, device_clock),
    never read off its name: a vendor's device type is a folder's value, not a word the core knows."""
    named = re.compile(r"\.type\s*[!=]=\s*['\"]|['\"](cpu|cuda|xpu|npu|musa|mlu)['\"]\s*[!=]=")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "flagperf" / "operation").glob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if named.search(line)]
    assert not found, "\n".join(found)


def test_inductor_mode_is_the_cases_choice_checked_in_one_line_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile's mode was fixed at its default: a lab could not time reduce-overhead (CUDA graphs) or
    max-autotune. The case's inductor_mode (the inference family's key and values, max-autotune-no-cudagraphs among
    them) reaches torch.compile and the implementation's line in the record, which says where a mode's CUDA graphs
    copy the inputs on every call and that the CPU has none; a mode torch does not have, a graph mode inside
    cuda_graphs: true (a nested capture) are one line each naming the file and the key; a mode no loaded implementation
    reads (OperatorImplementation.reads_inductor_mode) is one line naming the key."""
    from flagperf.inference.inductor import Options
    from flagperf.measure.inductor_modes import graphs_phrase

    assert OperationConfig.model_fields["inductor_mode"].annotation == Options.model_fields["inductor_mode"].annotation
    for changes, message in (
            ({"inductor_mode": "fastest"}, "'max-autotune-no-cudagraphs'"),
            ({"inductor_mode": "reduce-overhead", "cuda_graphs": True}, "reduce-overhead compiles into CUDA graphs, "
             "and cuda_graphs: true would capture those inside a graph of its own (a nested capture)")):
        with pytest.raises(ValidationError) as caught:
            config(**changes)
        error = pydantic_error_to_config_error(caught.value, "cases/operation/op-gemm/case.yaml")
        assert "\n" not in str(error) and error.key == "inductor_mode", str(error)
        assert str(error).startswith("cases/operation/op-gemm/case.yaml: inductor_mode: ") and message in str(error), \
            str(error)
    assert config().inductor_mode == "default"
    assert config(inductor_mode="max-autotune-no-cudagraphs", cuda_graphs=True, implementations=["native", "compile"]
                  ).cuda_graphs  # no graphs of its own
    assert config(inductor_mode="max-autotune", implementations=None).implementations is None  # compile among all
    # a mode no loaded implementation reads is refused where they load, by what each class reads, not its folder's
    # name (a vendor's folder of another name may compile; one named compile need not)
    with pytest.raises(CaseUserError) as refused:
        load_implementations(config(inductor_mode="max-autotune-no-cudagraphs", implementations=["native"]), "cpu",
                             CPU)
    assert str(refused.value).startswith("inductor_mode: max-autotune-no-cudagraphs is torch.compile's mode, and "
                                         "none of the implementations loaded here (native) compiles with it"), \
        str(refused.value)
    loaded = load_implementations(config(inductor_mode="max-autotune-no-cudagraphs", implementations=None), "cpu", CPU)
    assert [n for n, impl in loaded.ready.items() if impl.reads_inductor_mode] == ["compile"]
    assert load_implementations(config(implementations=["native"]), "cpu", CPU).ready  # default: nothing to read it

    modes: list[Any] = []
    real = torch.compile

    def compile_spy(fn: Any, **kwargs: Any) -> Any:
        modes.append(kwargs.get("mode"))
        return real(fn, **kwargs)  # compiled lazily: on a first call, which none makes here

    monkeypatch.setattr(torch, "compile", compile_spy)
    op = OPERATORS["add"]
    for mode, passed, graphs in (("default", None, ""), ("reduce-overhead", "reduce-overhead",
                                                         " (no CUDA graphs on cpu)"),
                                 ("max-autotune", "max-autotune", " (no CUDA graphs on cpu)"),
                                 ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", "")):
        impls = load_implementations(config(inductor_mode=mode, implementations=["compile"]), "cpu", CPU)
        impls.ready["compile"].prepare(op, "fp32", op.native)
        assert modes[-1] == passed
        assert f"fullgraph, mode {mode}{graphs}), torch " in impls.described["compile"], impls.described
    # on CUDA a graph mode's line says the graphs and the input copies each call makes (no device here to run one)
    assert graphs_phrase("reduce-overhead", "cuda").startswith("; CUDA graphs: each call first copies its inputs")
    assert graphs_phrase("max-autotune-no-cudagraphs", "cuda") == ""


def test_a_mode_no_compared_implementation_reads_is_refused_by_the_plan_and_validate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A non-default inductor_mode with no implementation that reads it was refused only once the implementations
    loaded on the host (their classes' reads_inductor_mode), after the plan had sent the round. Each implementation
    folder's engine.yaml declares the keys it reads (options: [inductor_mode]), read without importing it: the plan
    and `flagperf validate` refuse such a mode in one line naming the file and key; the host's check stays, and a
    class that disagrees with its manifest is one line naming the manifest and key."""
    from typer.testing import CliRunner

    from flows.cli import app

    for vendor, sets, source in (
            ("cpu", ["implementations=[native]", "inductor_mode=max-autotune"], "--set"),
            ("nvidia", ["implementations=[native,flaggems]", "inductor_mode=reduce-overhead"], "--set")):
        with pytest.raises(ConfigError) as refused:
            plan_run(cases=["op-gemm"], vendor=vendor, results_dir="/nonexistent-results", sets=sets)
        assert "\n" not in str(refused.value) and refused.value.key == "inductor_mode", str(refused.value)
        assert str(refused.value).startswith(f"{source}: inductor_mode: ") \
            and "reads it (their engine.yaml lists no inductor_mode under options)" in str(refused.value), \
            str(refused.value)
    for vendor, sets in (("cpu", ["inductor_mode=max-autotune", "implementations=[native,compile]"]),
                         ("nvidia", ["inductor_mode=max-autotune"])):  # null: every folder, compile among them
        plan_run(cases=["op-gemm"], vendor=vendor, results_dir="/nonexistent-results", sets=sets)

    case = tmp_path / "operation" / "op-gemm"
    (case / "vendor").mkdir(parents=True)
    text = (ROOT / "cases" / "operation" / "op-gemm" / "case.yaml").read_text(encoding="utf-8")
    (case / "case.yaml").write_text(text.replace("  inductor_mode: default", "  inductor_mode: max-autotune")
                                    .replace("  implementations: null", "  implementations: [native]"))
    (case / "vendor" / "cpu.yaml").write_text("implementations: [native, compile]\n")  # cpu's own choice reads it
    (case / "vendor" / "nvidia.yaml").write_text("implementations: [flaggems]\n")
    shown = display_path(case)
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml"), str(case / "vendor" / "cpu.yaml"),
                                    str(case / "vendor" / "nvidia.yaml")])
    refusal = (f"error {shown}/case.yaml: configurations.inductor_mode: max-autotune is torch.compile's mode, and "
               "none of the implementations compared ({}) reads it (their engine.yaml lists no inductor_mode under "
               "options): it would change nothing (set inductor_mode: default, or list one that compiles, such as "
               "compile)")
    # the defaults (native, in every vendor installed), then nvidia's flaggems, chosen after the mode: nvidia.yaml's
    # implementations are named, not the case's mode; cpu's choice has compile
    assert done.exit_code != 0 and [line for line in done.output.splitlines() if line.startswith("error")] == [
        refusal.format("native"),
        f"error {shown}/vendor/nvidia.yaml: implementations: none of flaggems of vendor nvidia reads inductor_mode: "
        f"max-autotune (from {shown}/case.yaml; their engine.yaml lists no inductor_mode under options): the mode "
        "would change nothing (list one that compiles, such as compile, or set inductor_mode: default)"], done.output
    # the key set last is named: --set implementations after the case's mode; within --set, the one given later; a
    # case's own --set (its layer after the general one) after a general --set, whatever their order on the line
    own = tmp_path / "cases" / "operation" / "op-gemm-compiled"
    own.mkdir(parents=True)
    (own / "case.yaml").write_text(text.replace("name: op-gemm", "name: op-gemm-compiled", 1)
                                   .replace("  inductor_mode: default", "  inductor_mode: max-autotune"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(own.parent.parent))
    for sets, key in ((["implementations=[native]"], "implementations"),
                      (["implementations=[native]", "inductor_mode=max-autotune"], "inductor_mode"),
                      (["inductor_mode=max-autotune", "implementations=[native]"], "implementations"),
                      (["inductor_mode=max-autotune", "op-gemm-compiled.implementations=[native]"], "implementations"),
                      (["op-gemm-compiled.implementations=[native]", "inductor_mode=max-autotune"], "implementations"),
                      (["op-gemm-compiled.implementations=[native]", "op-gemm-compiled.inductor_mode=reduce-overhead"],
                       "inductor_mode"),
                      # set again: its last place counts
                      (["inductor_mode=max-autotune", "implementations=[native]", "inductor_mode=reduce-overhead"],
                       "inductor_mode")):
        with pytest.raises(ConfigError) as refused:
            plan_run(cases=["op-gemm-compiled"], vendor="cpu", results_dir="/nonexistent-results", sets=sets)
        assert str(refused.value).startswith(f"--set: {key}: "), str(refused.value)
    assert f"ok    {shown}/vendor/cpu.yaml" in done.output, done.output

    # a vendor not installed here (acme) is judged by no installed vendor's folder of the same name: its native
    # may compile; what its folder declares is known with the vendor
    (case / "case.yaml").write_text(text.replace("  inductor_mode: default", "  inductor_mode: max-autotune"))
    for name in ("cpu", "nvidia"):
        (case / "vendor" / f"{name}.yaml").unlink()
    (case / "vendor" / "acme.yaml").write_text("implementations: [native]\n")
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
    assert done.exit_code == 0 and "vendor acme is not installed here" in done.output, done.output

    # the host's backstop: a class that disagrees with its folder's declaration is refused where it loads
    from flagperf.operation.compiled import Implementation as Compiled

    monkeypatch.setattr(Compiled, "reads_inductor_mode", False)
    disagreement = ("vendor_images/cpu/operation/compile/engine.yaml: options: lists inductor_mode, and its class "
                    "sets reads_inductor_mode = False: make the two agree")
    with pytest.raises(CaseUserError) as disagrees:
        load_implementations(config(inductor_mode="max-autotune", implementations=["compile"]), "cpu", CPU)
    assert str(disagrees.value) == disagreement
    # in the default mode nothing depends on it: an implementation written to the old docs still runs, told in the
    # task log and in the round's record (result.json's implementations), where a lab reading results sees it
    with caplog.at_level(logging.WARNING, logger=driver.log.name):
        loaded = load_implementations(config(implementations=["compile"]), "cpu", CPU)
    assert list(loaded.ready) == ["compile"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [disagreement]
    assert loaded.described["compile"].endswith(f"(vendor_images/cpu/operation/compile/engine.yaml); warning: "
                                                f"{disagreement}"), \
        loaded.described


def test_validate_without_a_vendor_checks_each_named_manifest_and_blames_it_not_the_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf validate case.yaml` (no vendor) read an implementation's options leniently: a string, [42] or null
    was taken as no options and the case's inductor_mode blamed; an unknown key or an option no implementation
    may list passed. Each folder named is now checked as the plan checks it: one line naming its engine.yaml."""
    from typer.testing import CliRunner

    from flows.cli import app

    acme = tmp_path / "vendors" / "acme"
    acme.mkdir(parents=True)
    (acme / "vendor.yaml").write_text((ROOT / "vendor_images" / "cpu" / "vendor.yaml").read_text(encoding="utf-8")
                                      .replace("name: cpu", "name: acme", 1))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(acme.parent))
    case = tmp_path / "operation" / "op-gemm"
    case.mkdir(parents=True)
    text = (ROOT / "cases" / "operation" / "op-gemm" / "case.yaml").read_text(encoding="utf-8")
    (case / "case.yaml").write_text(text.replace("  inductor_mode: default", "  inductor_mode: max-autotune")
                                    .replace("  implementations: null", "  implementations: [comp]"))
    folder = acme / "operation" / "comp"
    folder.mkdir(parents=True)
    base = "name: comp\ndescription: compiled\nmodule: flagperf.operation.compiled\n"
    for extra, key in (("options: inductor_mode\n", "options"), ("options: [42]\n", "options"),
                       ("options: null\n", "options"), ("options: [inductor_mode]\nspeed: 3\n", "speed"),
                       ("options: [inductor_mode, cuda_graphs]\n", "options")):
        (folder / "engine.yaml").write_text(base + extra)
        done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
        errors = [line for line in done.output.splitlines() if line.startswith("error")]
        assert done.exit_code != 0 and len(errors) == 1 \
            and errors[0].startswith(f"error {display_path(folder / 'engine.yaml')}: {key}"), (extra, done.output)
    (folder / "engine.yaml").write_text(base + "options: [inductor_mode]\n")
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
    assert done.exit_code == 0, done.output
    # implementations: null names none: one installed vendor's broken engine.yaml is that vendor's finding (vendor
    # check's), not an error of the case's defaults; in the default mode nothing is asked of them, in another the
    # others are (cpu's compile reads it)
    (folder / "engine.yaml").write_text(base + "options: [inductor_mode]\nspeed: 3\n")
    for mode in ("default", "max-autotune"):
        (case / "case.yaml").write_text(text.replace("  inductor_mode: default", f"  inductor_mode: {mode}"))
        done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
        assert done.exit_code == 0, (mode, done.output)
    # A case that lists them, validated with no vendor: the same. In the default mode nothing is asked of them; in
    # another, another installed vendor's folder of the name that reads the mode is enough; only where none does is
    # the broken file the case's error (it may be the one that reads it)
    (case / "case.yaml").write_text(text.replace("  implementations: null", "  implementations: [comp]"))
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
    assert done.exit_code == 0, done.output
    other = tmp_path / "vendors" / "acme2"
    shutil.copytree(acme, other)
    (other / "vendor.yaml").write_text((acme / "vendor.yaml").read_text(encoding="utf-8")
                                       .replace("name: acme", "name: acme2", 1))
    (other / "operation" / "comp" / "engine.yaml").write_text(base + "options: [inductor_mode]\n")
    (case / "case.yaml").write_text(text.replace("  inductor_mode: default", "  inductor_mode: max-autotune")
                                    .replace("  implementations: null", "  implementations: [comp]"))
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
    assert done.exit_code == 0, done.output
    (other / "operation" / "comp" / "engine.yaml").write_text(base + "options: []\n")
    done = CliRunner().invoke(app, ["validate", str(case / "case.yaml")])
    errors = [line for line in done.output.splitlines() if line.startswith("error")]
    assert done.exit_code != 0 and len(errors) == 1 \
        and errors[0].startswith(f"error {display_path(folder / 'engine.yaml')}: speed"), done.output


def test_every_shipped_implementations_declaration_matches_its_class() -> None:
    """The plan reads an implementation's engine.yaml (options), the host its class (reads_inductor_mode): for
    every shipped folder of every vendor the two say the same, and compile is one that reads the mode."""
    import importlib

    from flagperf.config.engines import checked_engine_manifest, engine_folders
    from flagperf.config.vendors import available_vendors
    from flagperf.operation.manifest import IMPLEMENTATIONS_FOLDER, INDUCTOR_MODE, ImplementationManifest

    seen = []
    for vendor in available_vendors():
        for name, folder in engine_folders(vendor, IMPLEMENTATIONS_FOLDER).items():
            manifest = checked_engine_manifest(folder, ImplementationManifest)
            assert manifest.module is not None, folder  # the shipped ones are shared modules
            # the module, not implementation_class: that one needs the library (flag_gems) installed
            cls = importlib.import_module(manifest.module).Implementation
            assert cls.reads_inductor_mode == (INDUCTOR_MODE in manifest.options), folder
            seen.append((vendor, name, cls.reads_inductor_mode))
    assert ("cpu", "compile", True) in seen and ("nvidia", "compile", True) in seen \
        and ("nvidia", "flaggems", False) in seen and ("cpu", "native", False) in seen, seen


def test_a_graph_modes_cuda_graph_trees_are_reset_after_each_point(cpu_spec: SpecTable,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA graph trees keep every point's graphs and their memory pool until reset, and a round's shapes never
    recur: the pool grew point by point. Each implementation hears when a point is done (point_done, after its
    calls and records); compile resets the trees there in a mode that makes them on CUDA, and nowhere else."""
    import torch._inductor.cudagraph_trees as trees

    from flagperf.operation.compiled import Implementation as Compiled

    done: list[int] = []

    class Counting(OperatorImplementation):
        def prepare(self, op: Any, dtype: str, native: Any) -> Any:
            return native

        def point_done(self) -> None:
            done.append(len(runner.points))  # once the point's record is made

    cfg = config(operators=["add", "softmax"])
    runner = PointRunner(cfg, cpu_spec, CPU, Implementations(ready={"counting": Counting(
        ImplEnv(device=CPU, log=logging.getLogger("test")))}))
    for point in plan_points(cfg):
        runner.run(point)
    assert done == [1, 2] and all(p.status == "passed" for p in runner.points)

    resets: list[bool] = []
    monkeypatch.setattr(trees, "reset_cudagraph_trees", lambda: resets.append(True))
    for device, mode, expected in (("cuda", "reduce-overhead", 1), ("cuda", "max-autotune", 1), ("cuda", "default", 0),
                                   ("cuda", "max-autotune-no-cudagraphs", 0), ("cpu", "reduce-overhead", 0)):
        resets.clear()
        # made, not run: the device need not be here for what point_done does
        Compiled(ImplEnv(device=torch.device(device), log=logging.getLogger("test"), inductor_mode=mode)).point_done()
        assert len(resets) == expected, (device, mode)


def test_every_key_of_the_operation_config_is_settable_in_every_shipped_case() -> None:
    """A run override may set only the keys a case.yaml lists (flagperf.config.cases.settable_keys): a key the
    Config has but the shipped case.yaml left out (inductor_mode) was refused by `--set` for every case."""
    from flagperf.measure.inductor_modes import INDUCTOR_MODES

    assert INDUCTOR_MODES == ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    for path in sorted((ROOT / "cases" / "operation").glob("*/case.yaml")):
        listed = set(load_yaml_mapping(path)["configurations"])
        assert set(OperationConfig.model_fields) <= listed, (path.parent.name,
                                                              set(OperationConfig.model_fields) - listed)
        # the line's comment names the values a user may give
        text = path.read_text(encoding="utf-8")
        comment = text[text.index("  inductor_mode:"):].split("\n  reference_cpu_max_elements")[0]
        assert all(re.search(rf"\b{re.escape(mode)}(,|$|\s)", comment) for mode in INDUCTOR_MODES), comment
    plan = plan_run(cases=["op-gemm"], vendor="nvidia", results_dir="/nonexistent-results",
                    sets=["inductor_mode=max-autotune-no-cudagraphs"])
    assert plan.cases[0].config["inductor_mode"] == "max-autotune-no-cudagraphs"
    assert plan.cases[0].origins["inductor_mode"] == "--set"


# ------------------------------------------------------------------ bench/operation_gpu.py


def test_the_gpu_bench_records_the_host_latency_beside_the_device_clocks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's --quick dry run on this CPU: every point has the host latency (FlagPerf's cputime, the engine's
    own timer), in the record and the table; the geometric mean of the host speed-ups beside the device clock's.
    With --energy-intervals the vendor's monitors sample around it at --monitor-interval and each passed point's
    energy loop runs (the bench passed no interval, so a GPU session never ran one): its energy per work, or why
    none (this CPU has no energy source), is in the record and the table."""
    done = subprocess.run([sys.executable, "bench/operation_gpu.py", "--quick", "--operators", "add,rms_norm",
                           "--cuda-graphs", "--energy-intervals", "3", "--monitor-interval", "0.1", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "operation_gpu_quick.json").read_text())
    assert record["energy"] == "0.3 s: energy_intervals 3 x the monitors' 0.1 s interval"
    assert record["monitors"]["system"]["exit"] == 0 and record["monitors"]["system"]["samples"] >= 2
    for p in record["points"]:
        if p["status"] == "passed" and p["energy_per_work"] is None:
            # this CPU: no energy counter to read; or one the system monitor reads (RAPL) that a 0.3 s loop on a
            # loaded host caught once only, which the note says
            assert p["energy_per_work_note"] == "no power or energy source in the monitors' samples (system)" or (
                "; operation: the energy loop ran (energy_intervals 3) and held 1 sample(s)"
                in p["energy_per_work_note"]), p
        elif p["status"] == "passed":  # a host whose monitor reads one: over the loop's own samples
            assert p["energy_per_work_samples"] >= 2 and p["energy_per_work_note"] is None, p
    assert "| % of roofline | energy per work | error |" in (tmp_path / "operation_gpu_quick.md").read_text()
    # --cuda-graphs asks the case key; the CPU has none, which the record says
    assert record["cuda_graphs"] is True and record["graphs"].startswith("the CPU has no device graphs")
    assert f"- graphs: {record['graphs']}" in (tmp_path / "operation_gpu_quick.md").read_text()
    native = [p for p in record["points"] if p["implementation"] == "native"]
    assert [p["operator"] for p in native] == ["add", "rms_norm"] and record["state"] == "finished"
    assert all(p["status"] == "passed" and p["host_latency_s"] > 0 for p in native)
    md = (tmp_path / "operation_gpu_quick.md").read_text()
    assert "| latency ms | host ms |" in md
    assert f"| {native[0]['latency_s'] * 1e3:.4g} | {native[0]['host_latency_s'] * 1e3:.4g} |" in md
    bad = subprocess.run([sys.executable, "bench/operation_gpu.py", "--quick", "--operators", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2 and "--operators: unknown nope" in bad.stderr

    sys.path.insert(0, str(ROOT))
    from bench import operation_gpu
    from bench.operation_gpu import Monitors, geomeans, markdown

    # a wrong energy loop is one line before anything runs; the monitors refuse an interval under 0.1 s, and they run
    # only for the energy loop
    for argv, message in ((["--energy-intervals", "2"], "--energy-intervals: 0 or 3 to 100 (got 2)"),
                          (["--energy-intervals", "3", "--monitor-interval", "0.05"],
                           "--monitor-interval: 0.1 to 60 seconds (got 0.05)"),
                          (["--monitor-interval", "0.5"], "--monitor-interval: the monitors run only with "
                                                          "--energy-intervals"),
                          (["--energy-intervals", "100", "--monitor-interval", "6"],
                           "--energy-intervals: energy_intervals: 100 x the monitors' 6 s interval = 600 s per point")):
        monkeypatch.setattr(sys, "argv", ["operation_gpu.py", "--quick", *argv])
        with pytest.raises(SystemExit) as stopped:
            operation_gpu.main()
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert stopped.value.code == 2 and message in error, error
    # energy per work over each point's energy loop, from the monitors' samples as a run's summary takes it
    from flagperf.operation.driver import OperationOutcome
    from flagperf.results.schema import Metric

    samples = tmp_path / "monitor_system.jsonl"
    samples.write_text("\n".join([json.dumps({"type": "header", "monitor": "system", "interval_s": 0.1})] + [
        json.dumps({"type": "sample", "t": T0 + i / 10, "energy_j": 5.0 * i}) for i in range(40)]) + "\n")
    monitors = Monitors.__new__(Monitors)  # its files planted: this CPU has no energy counter
    monitors.paths, monitors.procs = {"system": samples}, {}
    found = monitors.energy(OperationOutcome(metrics=[
        Metric(name="held", value=1.0, unit="GB/s", window=[T0, T0 + 1], work=1.0, energy_window=[T0 + 1.05, T0 + 1.5],
               energy_work=2.0, energy_intervals=3),  # 50 W x 0.45 s / 2 GB
        Metric(name="short", value=1.0, unit="GB/s", window=[T0, T0 + 1], work=1.0,
               energy_window=[T0 + 2.01, T0 + 2.09], energy_work=1.0, energy_intervals=3)],
        report=OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={}), measured_seconds=1.0))
    assert found["held"]["energy_per_work"] == pytest.approx(50.0 * 0.45 / 2.0)
    assert found["held"]["energy_per_work_unit"] == "J/GB" and found["held"]["energy_per_work_samples"] == 5
    assert found["short"]["energy_per_work"] is None and "the energy loop ran (energy_intervals 3) and held 0 " \
        "sample(s)" in found["short"]["energy_per_work_note"]
    # a figure with no work counted (0) has no energy per work for that reason, not for want of a source
    report = OperationReport(timing="t", flush="f", graphs="g", counting={}, tolerances={})
    nothing = monitors.energy(OperationOutcome(metrics=[Metric(name="zero", value=0.0, unit="GB/s", window=[T0, T0 + 1],
                                                               work=0.0)], report=report, measured_seconds=1.0))
    assert nothing["zero"]["energy_per_work_note"] == "no work counted for it (0.0): energy per work has nothing to " \
        "divide by"
    # a monitor that exited non-zero before its first sample: its exit code and the tail of its log, not "no source"
    broken = Monitors.__new__(Monitors)
    broken.paths, broken.logs = {"system": tmp_path / "broken.jsonl"}, {"system": tmp_path / "broken.log"}
    with broken.logs["system"].open("wb") as log:
        broken.procs = {"system": subprocess.Popen([sys.executable, "-c", "import sys; print('starting', file=sys."
                                                    "stderr); sys.exit('no counter readable')"], stderr=log)}
    broken.procs["system"].wait(timeout=60)
    note = broken.energy(OperationOutcome(metrics=[Metric(name="m", value=1.0, unit="GB/s", window=[T0, T0 + 1],
                                                          work=1.0)], report=report, measured_seconds=1.0))
    assert note["m"]["energy_per_work_note"] == "monitor system exited 1 with 0 samples (starting no counter readable)"
    # a vendor's monitor may write its JSON without spaces: its samples are samples (the run's own reader's)
    compact = Monitors.__new__(Monitors)
    compact.paths, compact.logs = {"own": tmp_path / "compact.jsonl"}, {"own": tmp_path / "compact.log"}
    compact.paths["own"].write_text('{"type":"header","monitor":"own"}\n' + "".join(
        f'{{"type":"sample","t":{T0 + i}}}\n' for i in range(3)))
    compact.procs = {"own": subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])}
    compact.procs["own"].wait(timeout=60)
    assert compact.failed() == [] and compact.stop() == {"own": {"exit": 3, "samples": 3}}
    # a failure while the monitors start (a second one that cannot, or the wait for their first samples) stops the
    # ones started: both are inside main's try; the monitors keep their own long limit (energy loops run past the
    # budget), ended by the parent's exit, the pid file and stop
    seen: list[Monitors] = []

    def wait_fails(self: Monitors, timeout_s: float = 60.0) -> None:
        seen.append(self)
        raise RuntimeError("a monitor could not start")

    monkeypatch.setattr(Monitors, "wait_sampling", wait_fails)
    monkeypatch.setattr(sys, "argv", ["operation_gpu.py", "--quick", "--operators", "add", "--energy-intervals", "3",
                                      "--budget-s", "4000", "--out", str(tmp_path / "stopped")])
    with pytest.raises(RuntimeError, match="a monitor could not start"):
        operation_gpu.main()
    (proc,) = seen[0].procs.values()
    assert proc.poll() is not None, "a monitor left running"
    assert "--max-seconds" not in proc.args and "--parent-pid" in proc.args

    def point(impl: str, shape: int, latency: float, host: float | None) -> dict[str, Any]:
        return {"operator": "add", "dtype": "bf16", "shape": {"R": shape}, "implementation": impl,
                "status": "passed", "latency_s": latency, "host_latency_s": host, "value": 1.0, "unit": "GB/s",
                "roofline": None, "error": None}

    points = [point("native", 1, 2e-3, 4e-3), point("flaggems", 1, 1e-3, 8e-3),
              point("native", 2, 2e-3, None), point("flaggems", 2, 4e-3, 1e-3)]
    (row,) = geomeans(points)
    assert row["geomean"] == pytest.approx(1.0) and row["points"] == 2
    assert row["host_geomean"] == pytest.approx(0.5) and row["host_points"] == 1  # native's second has none
    text = markdown({**record, "geomeans": [row], "points": points})
    assert "| bf16 | flaggems | 1.000 | 2 | 0.500 | 1 |" in text
    # a cell's newlines would end the table's row: each cell is one line
    broken_row = {**points[0], "status": "failed", "error": "RuntimeError: first line\nsecond | line"}
    text = markdown({**record, "geomeans": [], "points": [broken_row]})
    (row_line,) = [line for line in text.splitlines() if line.startswith("| add |")]
    assert row_line.endswith("| RuntimeError: first line second \\| line |"), row_line


def _reason_text(node: Any, module: Any) -> str:
    """A NoSample's reason argument as raised: its constants and module-level names read, a name known only when
    it is raised (the operator's) stood for by a word."""
    import ast

    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name) and hasattr(module, node.id):
        return str(getattr(module, node.id))
    if isinstance(node, ast.FormattedValue):
        return _reason_text(node.value, module)
    if isinstance(node, ast.JoinedStr):
        return "".join(_reason_text(part, module) for part in node.values)
    return "gemm"


def test_every_reason_a_point_has_no_host_sample_is_a_short_reason() -> None:
    """no_sample_reason takes a record whose reason is_no_sample_reason does not know for an older one (its words
    guessed from its full text): a new reason raised without being added there would be counted under a label of
    its own words, silently. Every NoSample raised in flagperf (read from the source: each one, not only those a
    test reaches) and the driver's failed host sample carry a reason it knows."""
    import ast
    import importlib

    from flagperf.paths import PROJECT_ROOT
    from flagperf.results.schema import HOST_FAILED, is_no_sample_reason

    assert is_no_sample_reason(HOST_FAILED)
    reasons: list[str] = []
    for path in sorted((PROJECT_ROOT / "flagperf").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Name) and node.func.id == "NoSample"]
        if not calls:
            continue
        module = importlib.import_module(".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts))
        for call in calls:
            given = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "reason")
            reason = _reason_text(given, module)
            assert is_no_sample_reason(reason), f"{display_path(path)}: line {call.lineno}: {reason!r}"
            reasons.append(reason)
    assert len(reasons) >= 3, reasons  # the three of sampled.py at least: the walk found them

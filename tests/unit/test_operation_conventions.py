"""The conventions an operation round holds to and states, as the field's operator benchmarks do (Triton's do_bench,
TritonBench, FlagGems' benchmark, torch.utils.benchmark): fp32 matrix products in IEEE fp32 whatever the process
was set to, an implementation that switches them failing its point; the cache flush at least Triton's 256 MB on an
accelerator; the CPU's thread count in the record."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from flagperf.config.memory import DeviceMemory
from flagperf.config.vendors import load_vendor
from flagperf.errors import CaseUserError
from flagperf.operation.config import ACCELERATOR_FLUSH_FLOOR, plan_points
from flagperf.operation.driver import Implementations, PointRunner, cache_flush, run_operation
from flagperf.operation.impls import ImplEnv, OperatorImplementation
from flagperf.operation.precision import (
    CUBLAS_TF32_OVERRIDE,
    IEEE,
    PinnedArithmetic,
    cublas_override,
    ieee_matmuls,
    matmul_arithmetic,
    not_ieee,
)
from flagperf.operation.timer import MEMORY_SIDE_CACHE, CacheFlush, flush_bytes, flush_description
from flagperf.results.schema import Peak, SpecTable
from tests.unit.test_operation import config

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_spec() -> SpecTable:
    return load_vendor("cpu").spec_table()


@pytest.fixture
def tf32_process() -> Iterator[dict[str, str]]:
    """The process set to TF32 products (as an environment or a library's import may leave it), put back after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield matmul_arithmetic()
    finally:
        torch.set_float32_matmul_precision(before)


class _Recorder(OperatorImplementation):
    """The native call, recording the fp32 matrix-product setting each call ran under."""

    seen: list[dict[str, str]]

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        def fn(*inputs: Any) -> Any:
            self.seen.append(matmul_arithmetic())
            return native(*inputs)
        return fn


class _Switcher(OperatorImplementation):
    """A library that turns on TF32 (and bf16 on the CPU) products when it prepares a point, and returns native's
    result: right, but its calls (and every later point's, left so) ran in another arithmetic than native's."""

    def prepare(self, op: Any, dtype: str, native: Any) -> Any:
        torch.set_float32_matmul_precision("medium")
        return native


def test_the_round_pins_ieee_products_states_it_and_gives_the_process_its_setting_back(
        tf32_process: dict[str, str], cpu_spec: SpecTable) -> None:
    outcome = run_operation(config(operators=["mm"]), "cpu", cpu_spec, CPU)
    assert [p.status for p in outcome.report.points] == ["passed"]
    assert f"pinned to '{IEEE}' for the round" in outcome.report.timing
    assert f"the process had {', '.join(f'{k} {v}' for k, v in tf32_process.items())}" in outcome.report.timing
    assert matmul_arithmetic() == tf32_process  # given back
    # ... both of torch's copies of it (the legacy one and the per-backend ones): read apart, they would raise
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32 is True


def test_an_implementation_that_switches_to_tf32_fails_and_the_next_runs_in_ieee(cpu_spec: SpecTable) -> None:
    env = ImplEnv(device=CPU, log=logging.getLogger("test"))
    recorder = _Recorder(env)
    recorder.seen = []
    cfg = config(operators=["mm", "add"])
    with ieee_matmuls() as pinned:
        runner = PointRunner(cfg, cpu_spec, CPU, Implementations(ready={"switcher": _Switcher(env), "rec": recorder}),
                             arithmetic=pinned)
        for point in plan_points(cfg):
            runner.run(point)
            # put back as a whole: the legacy setting too, which inductor keys its cache on and cuBLAS reads
            assert torch.get_float32_matmul_precision() == IEEE and torch.backends.cuda.matmul.allow_tf32 is False
        ieee = pinned.pinned
    by = {(p.operator, p.implementation): p for p in runner.points}
    for op in ("mm", "add"):
        switched = by[(op, "switcher")]
        assert switched.status == "failed" and switched.metric is None and switched.latency_s is None
        assert switched.error.startswith("changed torch's fp32 matrix-product arithmetic to "), switched.error
        assert "(IEEE fp32 is pinned for the round; put back for the points after)" in switched.error
        assert by[(op, "rec")].status == "passed"
    # every call of the implementation after it, in both points, ran in IEEE products
    assert recorder.seen and all(state == ieee for state in recorder.seen)
    assert not [m for m in runner.metrics if m.name.endswith("@switcher")]


def test_an_unchanged_setting_is_no_finding() -> None:
    with ieee_matmuls() as pinned:
        assert isinstance(pinned, PinnedArithmetic) and pinned.changed() is None


def _read(getter: Any) -> str:
    try:
        return str(getter())
    except RuntimeError:  # "you have used mix of the legacy and new APIs"
        return "raises"


def _everything_readable() -> tuple[str, ...]:
    return (_read(torch.get_float32_matmul_precision), _read(lambda: torch.backends.cuda.matmul.allow_tf32),
            _read(lambda: torch.backends.cuda.matmul.fp32_precision),
            _read(lambda: torch.backends.mkldnn.matmul.fp32_precision))


def _setter(obj: Any, name: str, value: Any) -> Any:
    return lambda: setattr(obj, name, value)


# Every way a process or an implementation writes the setting: the legacy global one (which writes the per-backend
# ones too), cuBLAS's legacy switch, and each per-backend one on its own (which leaves the legacy one as it was)
_WRITES = ([lambda v=v: torch.set_float32_matmul_precision(v) for v in ("highest", "high", "medium")]
           + [_setter(torch.backends.cuda.matmul, "allow_tf32", v) for v in (True, False)]
           + [_setter(torch.backends.cuda.matmul, "fp32_precision", v) for v in ("none", "ieee", "tf32")]
           + [_setter(torch.backends.mkldnn.matmul, "fp32_precision", v) for v in ("none", "ieee", "bf16", "tf32")])


@pytest.fixture
def fresh_setting() -> Iterator[None]:
    def reset() -> None:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = "none"
        torch.backends.mkldnn.matmul.fp32_precision = "none"
    reset()
    yield
    reset()


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch before 2.9: one setting")
def test_every_setting_comes_back_as_found_whatever_an_implementation_switched(fresh_setting: None) -> None:
    fresh = _everything_readable()
    writes = range(len(_WRITES))
    for before in [(), *((w,) for w in writes), *itertools.product(writes, writes)]:
        for switch in [None, *writes]:
            for w in before:
                _WRITES[w]()
            found = _everything_readable()
            pinned = PinnedArithmetic()
            assert _everything_readable() == ("highest", "False", "ieee", "ieee")
            if switch is not None:
                _WRITES[switch]()
            pinned.changed()  # re-pinned as a whole: no read raises for the rest of the round
            assert _everything_readable() == ("highest", "False", "ieee", "ieee"), (before, switch)
            pinned.restore()
            assert _everything_readable() == found, (before, switch)  # which reads raise included
            torch.set_float32_matmul_precision("highest")
            torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"
            assert _everything_readable() == fresh


@pytest.fixture
def generic_tf32() -> Iterator[None]:
    """torch.backends.fp32_precision (the process-wide setting since torch 2.9) set to TF32, put back after."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip("torch before the process-wide fp32_precision")
    before = torch.backends.fp32_precision
    torch.backends.fp32_precision = "tf32"
    try:
        yield
    finally:
        torch.backends.fp32_precision = before
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"


def test_a_process_wide_tf32_setting_is_pinned_and_read_back(generic_tf32: None, cpu_spec: SpecTable) -> None:
    """This torch writes IEEE to every backend when pinned, so the process-wide TF32 reaches none: the round runs,
    and gives the process its TF32 setting back."""
    found = matmul_arithmetic()
    outcome = run_operation(config(operators=["mm"]), "cpu", cpu_spec, CPU)
    assert [p.status for p in outcome.report.points] == ["passed"]
    assert "(cuda ieee, mkldnn ieee, float32_matmul_precision highest;" in outcome.report.timing
    assert torch.backends.fp32_precision == "tf32" and matmul_arithmetic() == found


def test_a_pin_a_backend_defers_through_to_tf32_fails_the_round_in_one_line(
        generic_tf32: None, cpu_spec: SpecTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose set_float32_matmul_precision('highest') leaves the per-backend settings deferring ("none") to
    the process-wide one: what this torch does, then the per-backend settings written as such a torch writes them."""
    found = matmul_arithmetic()
    real = torch.set_float32_matmul_precision

    def deferring(value: str) -> None:
        real(value)
        if value == IEEE:
            torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"

    monkeypatch.setattr(torch, "set_float32_matmul_precision", deferring)
    with pytest.raises(CaseUserError) as info:
        run_operation(config(operators=["mm"]), "cpu", cpu_spec, CPU)
    line = str(info.value)
    assert "\n" not in line and line.startswith("fp32 matrix products are not IEEE fp32 after "), line
    # as this torch reads them: a deferring setting reads as the one it defers to
    assert "cuda runs in tf32 (cuda.matmul, cuda, torch.backends fp32_precision: tf32 / none / tf32)" in line
    assert "mkldnn runs in tf32" in line and len(line) < 520
    monkeypatch.undo()
    assert matmul_arithmetic() == found  # given back before the round failed


def test_the_resolution_of_a_deferring_setting() -> None:
    assert not_ieee({"cuda": ["none", "none", "tf32"], "mkldnn": ["ieee", "bf16", "tf32"]}, "highest") == {
        "cuda": "tf32"}
    assert not_ieee({"mkldnn": ["default", "bf16", "none"]}, "highest") == {"mkldnn": "bf16"}
    assert not_ieee({"cuda": ["none", "none", "none"]}, "highest") == {}  # torch's default: the global setting's
    assert not_ieee({"cuda": ["none", "none", "none"]}, "high") == {"cuda": "high"}


def test_a_setting_none_reproduces_is_left_at_ieee_and_the_record_says_so(fresh_setting: None) -> None:
    torch.set_float32_matmul_precision("medium")
    pinned = PinnedArithmetic()
    found = pinned.before_observed
    pinned.before_observed = (found[0], "a reading no global setting gives back")
    pinned.restore()
    assert matmul_arithmetic() == pinned.pinned  # IEEE throughout, not the last one tried ("medium")
    assert pinned.not_restored and "could not be given back as found" in pinned.not_restored
    assert pinned.statement().endswith(f"so it was left at '{IEEE}' (IEEE fp32) throughout")
    pinned.before_observed = found
    pinned.restore()  # ... and where one does, nothing to say
    assert pinned.not_restored is None and pinned.statement().endswith("fails its point")
    assert torch.get_float32_matmul_precision() == "medium"


_OVERRIDDEN_START = """
import torch
from flagperf.operation.precision import ieee_matmuls
assert torch.backends.cuda.matmul.allow_tf32 is True  # what cuBLAS is asked for: TF32, from the environment
with ieee_matmuls() as pinned:
    assert torch.backends.cuda.matmul.allow_tf32 is False  # the pin wins: the variable is an initial value only
    print(pinned.statement())
assert torch.backends.cuda.matmul.allow_tf32 is True and torch.get_float32_matmul_precision() == "high"
"""


def test_the_cublas_override_of_an_ngc_image_is_a_starting_setting_the_round_pins_and_says(tmp_path: Path) -> None:
    env = {**os.environ, CUBLAS_TF32_OVERRIDE: "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _OVERRIDDEN_START], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{CUBLAS_TF32_OVERRIDE}=1 in the environment started it in TF32" in done.stdout
    assert "the process had cuda tf32" in done.stdout
    # torch's check_env takes "1" alone: "true" is a warning there and not set, so no note here either
    assert [cublas_override({CUBLAS_TF32_OVERRIDE: v}) for v in ("1", "true", "yes", "0", "")] == [True] + [False] * 4


MIB = 2**20
MI300X_INFINITY_CACHE = (256 * MIB, "the vendor's datasheet")


@pytest.mark.parametrize(("cache", "accelerator", "memory_side", "expected"), [
    (50 * MIB, True, None, 256 * MIB),                    # an H100's L2: twice it is under Triton's 256 MB
    (4 * MIB, True, None, 256 * MIB),                     # an L2 behind a memory-side cache nobody declared
    (None, True, None, 256 * MIB),                        # a device that does not say
    (200 * MIB, True, None, 400 * MIB),                   # twice a larger L2
    (4 * MIB, True, MI300X_INFINITY_CACHE, 512 * MIB),    # an MI300X: twice its declared 256 MiB Infinity Cache
    (300 * MIB, True, (100 * MIB, "a sheet"), 600 * MIB),  # the larger of the two is the last level
    (32 * MIB, False, None, 64 * MIB),                    # the CPU: twice its last-level cache, no floor
    (None, False, None, 128 * MIB),                       # a CPU that does not say: twice 64 MiB assumed
])
def test_the_flush_is_twice_the_last_level_cache_and_on_an_accelerator_at_least_tritons(
        cache: int | None, accelerator: bool, memory_side: tuple[int, str] | None, expected: int) -> None:
    assert flush_bytes(cache, accelerator, memory_side[0] if memory_side else None) == expected


def test_the_flush_line_says_its_size_and_why() -> None:
    assert flush_description(50 * MIB, "L2_cache_size of the device properties", True) == (
        "a 256 MiB buffer written between iterations (Triton's do_bench 256 MiB, more than twice the last-level "
        "cache: L2_cache_size of the device properties, 50.0 MiB)")
    assert flush_description(4 * MIB, "L2_cache_size of the device properties", True, MI300X_INFINITY_CACHE) == (
        "a 512 MiB buffer written between iterations (twice the last-level cache: the memory-side cache behind the "
        "L2: memory_side_cache of the vendor's spec table (the vendor's datasheet), 256.0 MiB)")
    assert flush_description(None, "not reported", True) == (
        "a 256 MiB buffer written between iterations (Triton's do_bench 256 MiB, more than twice the last-level "
        "cache: not reported; 64 MiB assumed)")
    cpu = flush_description(32 * MIB, "the largest cache of /sys/devices/system/cpu/cpu0/cache", False)
    assert cpu.startswith("a 64 MiB buffer written between iterations (twice the last-level cache: the largest "
                          "cache of /sys/devices/system/cpu/cpu0/cache, 32.0 MiB); the device's caches are the "
                          "host's, so each flush is followed by one untimed call"), cpu


def test_a_flush_the_device_cannot_hold_is_one_line(cpu_spec: SpecTable) -> None:
    """A declared memory-side cache no host could hold twice of: the real allocator refuses, the round says so."""
    huge = cpu_spec.model_copy(update={"peaks": {**cpu_spec.peaks, MEMORY_SIDE_CACHE: Peak(
        value=2.0**40, unit="MiB", source="a typo's exponent")}})
    with pytest.raises(CaseUserError) as info:
        cache_flush(CPU, huge)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"the cache flush's {2 * 2**40} MiB buffer does not fit"), info.value
    assert "flush_cache: false times without a flush" in str(info.value)


def test_the_plan_counts_the_flush_buffer_beside_the_largest_point() -> None:
    flushed, unflushed = config(operators=["mm"], flush_cache=True), config(operators=["mm"], flush_cache=False)
    with_flush, without = flushed.memory_need(), unflushed.memory_need()
    assert with_flush is not None and without is not None
    assert with_flush.bytes == without.bytes + ACCELERATOR_FLUSH_FLOOR
    assert "and the cache flush's 256 MiB buffer: flush_cache: false leaves it out)" in with_flush.what
    assert without.what.endswith("its inputs and output alone)"), without.what
    # on each host's device: an MI300X's Infinity Cache makes it twice that; where the device is the host's CPU, the
    # flush (twice its last-level cache) is left to the share kept free, not counted as an accelerator's 256 MiB
    mi300x = with_flush.on(DeviceMemory(shares_host_memory=False, memory_side_cache_bytes=256 * MIB))
    assert mi300x.bytes == without.bytes + 512 * MIB and mi300x.keys == without.keys
    assert ("and the cache flush's 512 MiB buffer (twice the memory-side cache of the vendor's spec table): "
            "flush_cache: false leaves it out)") in mi300x.what
    small = with_flush.on(DeviceMemory(shares_host_memory=False, memory_side_cache_bytes=64 * MIB))
    assert small[:3] == with_flush[:3]  # twice 64 MiB is under the floor
    host = with_flush.on(DeviceMemory(shares_host_memory=True))
    assert host.bytes == without.bytes and "alone: the cache flush's buffer, twice the host's last-level" in host.what
    assert unflushed.memory_need().on(DeviceMemory(shares_host_memory=False)) == without  # nothing to flush


def test_the_cpu_flush_and_record_say_their_size_and_threads(cpu_spec: SpecTable) -> None:
    flush = CacheFlush(CPU)
    assert flush.buffer.numel() == flush.nbytes and flush.description.startswith(
        f"a {flush.nbytes / MIB:.0f} MiB buffer written between iterations (twice the last-level cache: ")
    outcome = run_operation(config(operators=["add"], flush_cache=True), "cpu", cpu_spec, CPU)
    assert outcome.report.flush == flush.description
    assert f"torch's intra-op threads: {torch.get_num_threads()} (of " in outcome.report.timing

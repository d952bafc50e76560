"""flagperf.measure.device: the one synchronisation and the one device clock every family uses."""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from flagperf.measure.device import HostClock, current_stream, device_clock, device_module, synchronize

ROOT = Path(__file__).resolve().parents[2]


def test_the_cpu_has_no_queue_and_is_timed_by_the_host_clock() -> None:
    for device in ("cpu", torch.device("cpu")):
        assert device_module(device) is None and current_stream(device) is None
        synchronize(device)  # nothing to wait for: returns at once
        clock = device_clock(device)
        assert isinstance(clock, HostClock) and clock.name == "host clock (time.perf_counter)"
    clock = HostClock()
    start = clock.mark()
    deadline = time.perf_counter() + 0.01
    while time.perf_counter() < deadline:
        pass
    assert clock.seconds(start, clock.mark()) >= 0.01


def test_a_stream_given_is_the_one_waited_for() -> None:
    class Stream:
        waited = 0

        def synchronize(self) -> None:
            self.waited += 1

    stream = Stream()
    synchronize("cpu", stream)
    assert stream.waited == 1


# A device's queue or clock reached directly: torch.cuda.synchronize(), get_device_module(...).synchronize(...),
# module.Event(...), an event's elapsed_time.
DIRECT = re.compile(r"(torch\.\w+|get_device_module\([^)]*\)|\bmodule|device_module)\.(synchronize|Event)\("
                    r"|\.elapsed_time\(")


def test_no_family_waits_for_or_times_the_device_its_own_way() -> None:
    """Synchronisation and device timing were written five ways (training, inference's pipeline, Inductor,
    ONNX Runtime, the case kit); they live in flagperf/measure/device.py alone now."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / "flagperf").rglob("*.py")) if path != ROOT / "flagperf/measure/device.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if DIRECT.search(line)]
    assert not found, "use flagperf.measure.device (synchronize, device_clock):\n" + "\n".join(found)

"""PerfLog lines, FlagPerf's training log format: "[PerfLog] " + JSON with event, value and metadata.

    [PerfLog] {"event": "STEP_END", "value": {...}, "metadata": {"file": ..., "lineno": ..., "time_ms": ..., "rank": 0}}

Reading is forgiving (a line that is not a PerfLog line is ignored, a PerfLog line that does not parse is
counted as malformed) and fast enough for millions of lines (orjson, columns built once).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from flagperf.results.bounded import open_regular

PREFIX = "[PerfLog] "
EVENTS = ("INIT", "TRAIN", "EPOCH", "STEP", "EVALUATE", "FINISHED", "SUBMIT_INFO")
# How much of a rank's log is parsed at most: its last bytes, where FINISHED and the last events are. A long
# training run's log is far below this; one that is above (a case printing without end) is not read whole.
MAX_LOG_BYTES = 16 * 1024 * 1024


def format_line(event: str, value: dict[str, Any] | str, *, file: str, lineno: int, time_ms: int, rank: int) -> str:
    payload: dict[str, Any] = {"event": event, "metadata": {"file": file, "lineno": lineno, "time_ms": time_ms,
                                                            "rank": rank}}
    payload["value" if isinstance(value, dict) else "other"] = value
    return PREFIX + json.dumps(payload)


@dataclass
class PerfLog:
    events: pd.DataFrame  # columns: event, rank, time_ms, value (dict or None)
    malformed: int
    lines: int
    skipped_bytes: int = 0  # the start of a file longer than parse_file reads: not parsed

    def read_from_end_note(self) -> str:
        """"" when the whole log was parsed, else a note saying how much of it was."""
        return f" (from the log's end only: its first {self.skipped_bytes} bytes were not read)" \
            if self.skipped_bytes else ""

    def finished(self) -> dict[int, dict[str, Any]]:
        """The FINISHED value of each rank."""
        done = self.events[self.events["event"] == "FINISHED"]
        return {int(r): v for r, v in zip(done["rank"], done["value"], strict=True)
                if isinstance(v, dict) and pd.notna(r)}


def parse_text(text: str) -> PerfLog:
    payloads: list[str] = []
    lines = 0
    for line in text.splitlines():
        lines += 1
        start = line.find(PREFIX)
        if start >= 0:
            payloads.append(line[start + len(PREFIX):])
    return _decode(payloads, lines)


def _decode(payloads: list[str], lines: int) -> PerfLog:
    malformed = 0
    events: list[str] = []
    ranks: list[Any] = []
    times: list[Any] = []
    values: list[Any] = []
    for payload in payloads:
        try:
            record = orjson.loads(payload)
        except orjson.JSONDecodeError:
            malformed += 1
            continue
        event = record.get("event") if isinstance(record, dict) else None
        if not isinstance(event, str):
            malformed += 1
            continue
        meta = record.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        events.append(event)
        ranks.append(meta.get("rank"))
        times.append(meta.get("time_ms"))
        values.append(record.get("value", record.get("other")))
    frame = pd.DataFrame({"event": events, "rank": pd.to_numeric(pd.Series(ranks, dtype=object), errors="coerce"),
                          "time_ms": pd.to_numeric(pd.Series(times, dtype=object), errors="coerce"),
                          "value": pd.Series(values, dtype=object)})
    return PerfLog(events=frame, malformed=malformed, lines=lines)


def parse_file(path: Path, max_bytes: int = MAX_LOG_BYTES) -> PerfLog:
    """The PerfLog of a rank's log, from its last ``max_bytes`` at most (the cut's partial first line dropped; the
    result's skipped_bytes says how much was not read). ValueError naming the file when it is not a regular file
    (a FIFO is never waited on); OSError when it cannot be opened."""
    handle = open_regular(path)
    if handle is None:
        path.stat()  # missing or unreadable: the OSError that says so
        raise ValueError(f"{path}: not a regular file; not read")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        skipped = max(0, size - max_bytes)
        handle.seek(skipped)
        data = handle.read(max_bytes)
    if skipped and b"\n" in data:
        cut = data.index(b"\n") + 1
        data, skipped = data[cut:], skipped + cut
    log = parse_text(data.decode("utf-8", errors="replace"))
    log.skipped_bytes = skipped
    return log


def summarize_steps(log: PerfLog, throughput_key: str) -> dict[str, Any]:
    """Per rank: steps seen, and the mean / p50 of a throughput value carried by STEP_END events."""
    steps = log.events[log.events["event"] == "STEP_END"]
    values = pd.to_numeric(steps["value"].map(lambda v: v.get(throughput_key) if isinstance(v, dict) else None),
                           errors="coerce")
    out: dict[str, Any] = {"steps": len(steps), "malformed": log.malformed, "lines": log.lines}
    if values.notna().any():
        out.update(mean=float(values.mean()), p50=float(values.median()))
    return out

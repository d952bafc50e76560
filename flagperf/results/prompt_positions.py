"""Where a run's prompt streams at endpoints stand: a round that loads an endpoint (a long-lived server, whose prefix
cache keeps the prompts it was sent) records in its folder which positions of its prompt stream it took, and every
later round, attempt and retry of the run starts after every position taken before it, so that none resends a prompt
the endpoint has seen (a resent prompt's prefill may come from the cache: TTFT and goodput would be flattered).

A stream is an endpoint with a prompt source (flagperf.generate.serve.stream_key): the same stream gives the same prompt
at the same position, whichever round or case sends it. A position is the n-th prompt of the source: synthetic, prompt
n of the seed's sequence; a file (keyed by its text's digest), its entry n mod its count of entries (read round and
round; a ShareGPT conversation a case's length filter leaves out keeps its position, and is skipped). The round's
record,
``prompt_positions.json``::

    {"stream": "...", "first": 120, "reserved": 184, "end": 151}

first: the round's first position; reserved: positions below it may have been sent (written before they are sent, so
that a round killed meanwhile leaves a bound); end: the position after the last one it sent, written as the round ends
(null while it runs, and where it was killed).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from flagperf.results.bounded import read_bounded

PROMPT_POSITIONS = "prompt_positions.json"
MAX_POSITIONS_BYTES = 64 * 1024  # a record is a few hundred bytes; one larger is not ours
# A position past this is no run's: 10^12 prompts is a million requests a second for eleven days. A record that says
# more is not ours (a round would start there, and a synthetic stream draws every prompt before its start).
MAX_POSITION = 10**12

log = logging.getLogger(__name__)


def passed_over(where: str, why: str) -> None:
    """The warning for a record that cannot be read: the positions it took are not known, so a later round may resend
    its prompts."""
    log.warning("%s: %s; the prompt positions it records are passed over, so a later round at its endpoint may resend "
                "prompts it sent (the endpoint's prefix cache may serve them)", where, why)
# Where a run folder keeps rounds (flagperf.results.schema.round_dir): a round's last attempt on top, its earlier ones
# under attempts/, and the rounds a retry of the run ran again set aside under retries/attempt<K>/.
ROUND_GLOBS = ("*/round*/*_noderank*", "retries/attempt*/*/round*/*_noderank*")


def write_positions(path: Path, stream: str, first: int, reserved: int, end: int | None) -> None:
    """The record, replaced whole (a reader sees the old one or the new); not flushed to disk: it is read back after the
    case process ends, not after the host fails, and it may be written while requests are in flight."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"stream": stream, "first": first, "reserved": reserved, "end": end}) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def is_position(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_POSITION


def taken_end(text: str) -> tuple[str, int] | None:
    """(stream, the position after every one the round took) of a record's text: its end, else (killed, or still
    running) what it reserved; None for a record that is not one (positions are 0 to MAX_POSITION)."""
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("stream"), str):
        return None
    values = [record.get(key) for key in ("first", "reserved", "end")]
    if not all(v is None or is_position(v) for v in values):
        return None
    first, reserved, end = values
    taken = end if end is not None else reserved
    if taken is None:
        return None
    return record["stream"], max(taken, first or 0)


def merged(positions: dict[str, int], records: Iterable[tuple[str, str]]) -> dict[str, int]:
    """``positions`` with each record's end (``taken_end``) where it is further on; ``records``: (where it was read,
    its text). One that is not a record is passed over, with a warning."""
    out = dict(positions)
    for where, text in records:
        found = taken_end(text)
        if found is None:
            passed_over(where, f"not a record of prompt positions (positions are 0 to {MAX_POSITION})")
            continue
        stream, end = found
        out[stream] = max(out.get(stream, 0), end)
    return out


def positions_taken(run_dir: Path) -> dict[str, int]:
    """For each stream, the position after every one the run folder's rounds took: their last attempts, earlier
    attempts, and the rounds set aside by a retry (and their attempts). A record that cannot be read is passed over,
    with a warning."""
    records = []
    for pattern in ROUND_GLOBS:
        for folder in sorted(run_dir.glob(pattern)):
            for path in (folder / PROMPT_POSITIONS, *sorted(folder.glob(f"attempts/attempt*/{PROMPT_POSITIONS}"))):
                try:
                    records.append((str(path), read_bounded(path, MAX_POSITIONS_BYTES).decode("utf-8", "replace")))
                except FileNotFoundError:  # a round that loaded no endpoint
                    continue
                except OSError as exc:
                    passed_over(str(path), f"cannot be read: {exc.strerror or exc}")
                except ValueError as exc:  # its message names the file first
                    passed_over(str(path), str(exc).partition(": ")[2] or str(exc))
    return merged({}, records)

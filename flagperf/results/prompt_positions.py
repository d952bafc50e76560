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

That record is on the host until the controller collects the round: a round interrupted before (the controller
stopped, the host lost, the round's folder there removed) leaves none the run folder has. So the controller first
writes a **reservation** into the run folder, ``prompt_positions/reserved-<id>.json``, durably, before it dispatches
the round: the round's case and configuration, how many attempts it may make, and what decided where it starts (its
job's positions and the reservations it starts after: ``Reservation``). Which stream the round sends and how far it
may get is known on the host only (a stream is keyed by the digests of files there), so every open reservation goes
to the next rounds' jobs, and a round there starts after the most each one of its own stream may have taken
(flagperf.generate.serve.stream_start). Once its round's folder, with its records, is stored in the run folder, a
reservation is closed (renamed ``collected-<id>.json``: kept, since an open one that started after it is worked out
from it); the records a half round left on its host are kept in ``prompt_positions/recovered-<id>.json`` (records as
above) before its folder there is removed and its reservation closed.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


# The run folder's own records of prompt positions: reservations (before a round is dispatched: open, then closed once
# its records are stored) and the records of half rounds removed from their hosts.
RUN_POSITIONS_DIR = "prompt_positions"
OPEN, CLOSED, RECOVERED = "reserved-", "collected-", "recovered-"
MAX_RESERVATION_BYTES = 1 << 20  # a case's configuration and a few names; one larger is not ours


class Reservation(BaseModel):
    """A round at an endpoint that the controller dispatched (``prompt_positions/reserved-<id>.json``): its case, its
    configuration as the job has it, how many attempts it may make, and what decided where it started: the job's
    prompt positions and the reservations it started after (``after``, by id). The host works out its stream, its
    start and the most it may have taken from these (flagperf.generate.serve.stream_start). ``id`` (its file's name)
    and ``open`` (its records are not in the run folder) are not written in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case: str
    round: int = Field(ge=1)
    host: str
    node_rank: int = Field(ge=0, default=0)
    attempts: int = Field(ge=1, le=100, description="the round's attempts at most: max_retries + 1")
    config: dict[str, Any]
    positions: dict[str, Annotated[int, Field(ge=0, le=MAX_POSITION)]] = Field(default_factory=dict)
    after: list[str] = Field(default_factory=list)
    id: str = ""
    open: bool = True

    def same_round(self, case: str, round_no: int, host: str, node_rank: int) -> bool:
        return (self.case, self.round, self.host, self.node_rank) == (case, round_no, host, node_rank)

    @property
    def where(self) -> str:
        return f"{RUN_POSITIONS_DIR}/{OPEN if self.open else CLOSED}{self.id}.json"


def durable_write(path: Path, text: str) -> None:
    """``text`` as ``path``, whole or not at all: written to a temporary name beside it, flushed to disk, renamed, and
    the rename flushed too (the folder), so that what is written is there after the controller is killed or its
    machine fails. On any failure (a full disk) the temporary file is removed and the error raised."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _new_id() -> str:
    """Ids sort in the order they were made (the reservations are applied in the order the rounds were dispatched)."""
    return f"{time.time_ns():020d}-{secrets.token_hex(4)}"


def reserve(run_dir: Path, reservation: Reservation) -> Reservation:
    """Write ``reservation`` into the run folder before its round is dispatched; returns it with its id. An OSError (a
    full or read-only results folder) leaves nothing behind: the round must then not be sent."""
    folder = run_dir / RUN_POSITIONS_DIR
    folder.mkdir(exist_ok=True)
    made = reservation.model_copy(update={"id": _new_id(), "open": True})
    durable_write(folder / f"{OPEN}{made.id}.json", made.model_dump_json(exclude={"id", "open"}) + "\n")
    return made


def _read(path: Path, reservation_id: str, is_open: bool) -> Reservation | None:
    try:
        text = read_bounded(path, MAX_RESERVATION_BYTES)
        return Reservation.model_validate_json(text).model_copy(update={"id": reservation_id, "open": is_open})
    except FileNotFoundError:  # closed meanwhile
        return None
    except OSError as exc:
        passed_over(str(path), f"cannot be read: {exc.strerror or exc}")
    except ValidationError as exc:
        passed_over(str(path), f"not a reservation ({exc.error_count()} problem(s))")
    except ValueError as exc:  # its message names the file first
        passed_over(str(path), str(exc).partition(": ")[2] or str(exc))
    return None


def reservations(run_dir: Path) -> list[Reservation]:
    """The run folder's open reservations (rounds dispatched whose records it does not hold), in the order they were
    made, and the closed ones they started after (``after``, followed to the end): what a round at an endpoint needs to
    know where those rounds started and how far they may have got. One that cannot be read is passed over, with a
    warning (the round it stood for may have sent prompts a later round sends again)."""
    folder = run_dir / RUN_POSITIONS_DIR
    found: dict[str, Reservation] = {}
    for path in sorted(folder.glob(f"{OPEN}*.json")):
        read = _read(path, path.name.removeprefix(OPEN).removesuffix(".json"), True)
        if read is not None:
            found[read.id] = read
    wanted = [name for r in found.values() for name in r.after]
    while wanted:
        name = wanted.pop()
        if name in found or "/" in name or name.startswith("."):
            continue
        read = _read(folder / f"{CLOSED}{name}.json", name, False) or _read(folder / f"{OPEN}{name}.json", name, True)
        if read is not None:
            found[name] = read
            wanted += read.after
    return sorted(found.values(), key=lambda r: r.id)


def close(run_dir: Path, reservation: Reservation) -> None:
    """Close a reservation whose round's records are in the run folder now: kept (a later reservation that started
    after it is worked out from it), but no longer a bound for later rounds. A close that does not happen leaves it
    open, which only makes later rounds start further on."""
    folder = run_dir / RUN_POSITIONS_DIR
    os.replace(folder / f"{OPEN}{reservation.id}.json", folder / f"{CLOSED}{reservation.id}.json")
    _sync_folder(folder)


def recover(run_dir: Path, records: Iterable[str]) -> None:
    """Keep the records of a half round about to be removed from its host in the run folder, durably (each record's
    text as read, passed on as it is: a reader checks it)."""
    folder = run_dir / RUN_POSITIONS_DIR
    for text in records:
        folder.mkdir(exist_ok=True)
        durable_write(folder / f"{RECOVERED}{_new_id()}.json", text if text.endswith("\n") else text + "\n")


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
    attempts, the rounds set aside by a retry (and their attempts), and the records of half rounds removed from their
    hosts (prompt_positions/recovered-*.json). A record that cannot be read is passed over, with a warning."""
    records = []
    paths = [path for pattern in ROUND_GLOBS for folder in sorted(run_dir.glob(pattern))
             for path in (folder / PROMPT_POSITIONS, *sorted(folder.glob(f"attempts/attempt*/{PROMPT_POSITIONS}")))]
    paths += sorted((run_dir / RUN_POSITIONS_DIR).glob(f"{RECOVERED}*.json"))
    for path in paths:
        try:
            records.append((str(path), read_bounded(path, MAX_POSITIONS_BYTES).decode("utf-8", "replace")))
        except FileNotFoundError:  # a round that loaded no endpoint
            continue
        except OSError as exc:
            passed_over(str(path), f"cannot be read: {exc.strerror or exc}")
        except ValueError as exc:  # its message names the file first
            passed_over(str(path), str(exc).partition(": ")[2] or str(exc))
    return merged({}, records)

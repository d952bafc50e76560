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

    {"stream": "...", "first": 120, "reserved": 184, "end": 151, "bound": 440, "attempt_bound": 230}

first: the round's first position; reserved: positions below it may have been sent (written before they are sent, so
that a round killed meanwhile leaves a bound); end: the position after the last one it sent, written as the round ends
(null while it runs, and where it was killed); bound: the position after the most the round may take in this attempt
and the ones after it (its planned requests from ``first``: flagperf.generate.serve.reserved_end), written before it
sends; attempt_bound: the same for this attempt alone (a retry in the round starts after it where this attempt's end
was not seen: it may still be sending).

That record is on the host until the controller collects the round: a round interrupted before (the controller
stopped, the host lost, the round's folder there removed) leaves none the run folder has. So the controller first
writes a **reservation** into the run folder, ``prompt_positions/reserved-<id>.json``, durably, before it dispatches
the round: the round's case and configuration, how many attempts it may make, and what decided where it starts (its
job's positions and the reservations it starts after: ``Reservation``). Which stream the round sends and how far it
may get is known on the host only (a stream is keyed by the digests of files there), so once the round's attempts end
(or are interrupted) the controller keeps their stream and bound beside the reservation, ``reach-<id>.json``
(``Reach``), where it can read every attempt's record. Every open reservation goes to the next rounds' jobs, and a
round there starts after each one of its own stream: after what its attempts took where its reach says (of each attempt
whose case process its runtime saw end, by the controller's own marker, ``CONTROLLER_ENDED_FILE``; of any other, its
bound: it may still be sending), else after the most they may have taken: worked out from its configuration where the
host can (flagperf.generate.serve.stream_start). Once its round's folder, with its records, is
stored in the run folder, a reservation is closed (renamed ``collected-<id>.json``: kept, since an open one that
started after it is worked out from it); so is one whose kept reach lies within what the run folder's records say
was taken on its stream (``close_passed``: a later round started after it; never on a reach a later round's case
wrote, its serving.json's). The records a half round left on its host are
kept in ``prompt_positions/recovered-<id>.json`` (records as above) before its folder there is removed, and its
reservation closed where every attempt's record was read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flagperf.results.bounded import read_bounded
from flagperf.results.schema import atomic_path, sync_folder

PROMPT_POSITIONS = "prompt_positions.json"
# In a stored attempt's folder: the controller's own record that the attempt's runtime saw its case process end (an
# exit code, and no word of a lost link): only then is what its record says it took final (``reach_of``). On the host
# it is kept outside every folder a case can write (flagperf.hosts.local.Host.ended_path), and collection brings it
# in under this name; one a case wrote into its own folder is removed, never trusted.
CONTROLLER_ENDED_FILE = "controller-ended.json"
# What an older version wrote in the attempt's folder itself, where case code (and a container, which gets its run's
# folder) can write it too: never read as proof that an attempt ended.
ENDED_FILE = "ended.json"
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
OPEN, CLOSED, RECOVERED, REACH = "reserved-", "collected-", "recovered-", "reach-"
MAX_RESERVATION_BYTES = 1 << 20  # a case's configuration and a few names; one larger is not ours


class Reach(BaseModel):
    """Where a reserved round's prompts lie: its stream, the position after the most it may take there (``end``: the
    largest ``bound`` its attempts' records give, written before they sent), and the position after every one they
    took (``taken``: of each attempt whose case process its runtime saw end, its end, else what it reserved; of any
    other, its bound: it may still be sending). A later round starts after ``taken`` where it is known (``upto``), else
    after ``end``; a later reservation's own start is worked out from ``end`` (where that round started)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: str
    end: int = Field(ge=0, le=MAX_POSITION)
    taken: int | None = Field(default=None, ge=0, le=MAX_POSITION)
    # Its taken trusts only attempts seen to end. One kept by an older version lacks these: with no ended_checked its
    # taken trusted every attempt's record; with no ended_by_controller it trusted an ended.json in the attempt's
    # folder, which case code could have written. Either is read as unknown (a later round starts after its end).
    ended_checked: bool = False
    ended_by_controller: bool = False

    @property
    def upto(self) -> int:
        """Where a later round of its stream starts at the earliest: what it took where known, else its bound."""
        return self.taken if self.taken is not None else self.end


class SeenReach(BaseModel):
    """What a round's job saw of a reservation it started after: that reservation's kept reach (its stream, and where
    the round started after it: ``Reach.upto``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: str
    upto: int = Field(ge=0, le=MAX_POSITION)


WORKED_OUT = "worked out"  # a round's job had no kept reach of a reservation it started after: it worked it out


class Reservation(BaseModel):
    """A round at an endpoint that the controller dispatched (``prompt_positions/reserved-<id>.json``): its case, its
    configuration as the job has it, how many attempts it may make, and what decided where it started: the job's
    prompt positions and the reservations it started after (``after``, by id). The host works out its stream, its
    start and the most it may have taken from these (flagperf.generate.serve.stream_start), unless its ``reach`` is
    known (its round's own records, kept beside it). ``id`` (its file's name), ``open`` (its records are not in the
    run folder) and ``reach`` are not written in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case: str
    round: int = Field(ge=1)
    host: str
    node_rank: int = Field(ge=0, default=0)
    attempts: int = Field(ge=1, le=100, description="the round's attempts at most: max_retries + 1")
    config: dict[str, Any]
    positions: dict[str, Annotated[int, Field(ge=0, le=MAX_POSITION)]] = Field(default_factory=dict)
    after: list[str] = Field(default_factory=list)
    # By id (of ``after``): what the round's job saw of each (its kept reach), or WORKED_OUT (it worked it out from
    # its configuration): where the round started is worked out from this, never from a reach kept only later
    seen: dict[str, SeenReach | Literal["worked out"]] = Field(default_factory=dict)
    id: str = ""
    open: bool = True
    reach: Reach | None = None

    def same_round(self, case: str, round_no: int, host: str, node_rank: int) -> bool:
        return (self.case, self.round, self.host, self.node_rank) == (case, round_no, host, node_rank)

    @property
    def where(self) -> str:
        return f"{RUN_POSITIONS_DIR}/{OPEN if self.open else CLOSED}{self.id}.json"


def _new_id() -> str:
    """Ids sort in the order they were made (the reservations are applied in the order the rounds were dispatched)."""
    return f"{time.time_ns():020d}-{secrets.token_hex(4)}"


def _write(path: Path, text: str) -> None:
    """``text`` as ``path``, whole or not at all, durably (flagperf.results.schema.atomic_path: flushed, renamed, the
    folder flushed, and the folders it made for it too); an OSError (a full disk) leaves no temporary file."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def reserve(run_dir: Path, reservation: Reservation) -> Reservation:
    """Write ``reservation`` into the run folder before its round is dispatched; returns it with its id. An OSError (a
    full or read-only results folder) leaves nothing behind: the round must then not be sent."""
    made = reservation.model_copy(update={"id": _new_id(), "open": True, "reach": None})
    path = run_dir / RUN_POSITIONS_DIR / f"{OPEN}{made.id}.json"
    try:
        _write(path, made.model_dump_json(exclude={"id", "open", "reach"}) + "\n")
    except BaseException:  # also where renamed but not flushed: the round is not sent, so nothing is reserved
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        raise
    return made


def keep_reach(run_dir: Path, reservation: Reservation, reach: Reach) -> None:
    """Keep where ``reservation``'s round sends (its records' stream and bound) beside it, durably: later rounds read
    it instead of working it out from the round's configuration (which a host without the round's files cannot)."""
    _write(run_dir / RUN_POSITIONS_DIR / f"{REACH}{reservation.id}.json", reach.model_dump_json() + "\n")


def _read_reach(folder: Path, reservation_id: str) -> Reach | None:
    path = folder / f"{REACH}{reservation_id}.json"
    try:
        reach = Reach.model_validate_json(read_bounded(path, MAX_POSITIONS_BYTES))
        proven = reach.ended_checked and reach.ended_by_controller
        return reach if proven else reach.model_copy(update={"taken": None})
    except FileNotFoundError:  # not kept: its round's records were not read (yet)
        return None
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        log.warning("%s: not read (%s); its round's reach is worked out from its configuration", path,
                    " ".join(str(getattr(exc, "strerror", None) or exc).split())[:200])
        return None


def _read(path: Path, reservation_id: str, is_open: bool) -> Reservation | None:
    try:
        text = read_bounded(path, MAX_RESERVATION_BYTES)
        return Reservation.model_validate_json(text).model_copy(update={
            "id": reservation_id, "open": is_open, "reach": _read_reach(path.parent, reservation_id)})
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
    sync_folder(folder)


def close_passed(run_dir: Path) -> list[Reservation]:
    """Close the open reservations whose reach, kept beside them by the controller (``keep_reach``), lies within what
    the run folder's records say was taken on its stream: every later round starts past it anyway, so it bounds nothing
    more, and no later round pays for working it out again. One without a kept reach stays open (later rounds keep
    working it out: they skip further, never resend): what a later round's case wrote of it (serving.json's
    ``reservation_reaches``) is case-written, and a forged ``upto`` of 0 would close a lost round's reservation.
    Returns those closed (a close that fails leaves one open, which only costs that)."""
    taken = positions_taken(run_dir)
    closed = []
    for reservation in reservations(run_dir):
        reach = reservation.reach
        if reservation.open and reach is not None and taken.get(reach.stream, 0) >= reach.upto:
            with contextlib.suppress(OSError):
                close(run_dir, reservation)
                closed.append(reservation)
    return closed


def recover(run_dir: Path, records: Iterable[str]) -> None:
    """Keep the records of a half round about to be removed from its host in the run folder, durably (each record's
    text as read, passed on as it is: a reader checks it)."""
    for text in records:
        _write(run_dir / RUN_POSITIONS_DIR / f"{RECOVERED}{_new_id()}.json", text.rstrip("\n") + "\n")


def write_positions(path: Path, stream: str, first: int, reserved: int, end: int | None, bound: int | None = None,
                    attempt_bound: int | None = None) -> None:
    """The record, replaced whole (a reader sees the old one or the new); not flushed to disk: it is read back after the
    case process ends, not after the host fails, and it may be written while requests are in flight."""
    tmp = path.with_name(f".{path.name}.tmp")
    record = {"stream": stream, "first": first, "reserved": reserved, "end": end}
    if bound is not None:
        record["bound"] = bound
    if attempt_bound is not None:
        record["attempt_bound"] = attempt_bound
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def is_position(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_POSITION


def _record(text: str) -> dict[str, Any] | None:
    """A record's fields, or None for text that is not one (positions are 0 to MAX_POSITION)."""
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("stream"), str):
        return None
    if not all(record.get(key) is None or is_position(record[key]) for key in ("first", "reserved", "end", "bound",
                                                                              "attempt_bound")):
        return None
    return record


def taken_end(text: str) -> tuple[str, int] | None:
    """(stream, the position after every one the round took) of a record's text: its end, else (killed, or still
    running) what it reserved; None for a record that is not one (positions are 0 to MAX_POSITION)."""
    record = _record(text)
    if record is None:
        return None
    first, reserved, end = (record.get(key) for key in ("first", "reserved", "end"))
    taken = end if end is not None else reserved
    if taken is None:
        return None
    return record["stream"], max(taken, first or 0)


def reach_of(attempts: Iterable[tuple[str, bool]]) -> Reach | None:
    """A round's reach from its attempts' records, each as (its text, whether its case process is known to have ended:
    its runtime saw it end, by the controller's marker): each one's ``bound``, and its ``taken``: what each attempt
    known to have ended took, the bound of each one not known to have (it may still be sending: a link that dropped, a
    container not removed, a job cancelled but not yet gone). None where there is none, one is not a record or has no
    bound (written by an older version), or they name two streams."""
    streams, ends, took_ends = set(), [], []
    for text, ended in attempts:
        record, took = _record(text), taken_end(text)
        if record is None or took is None or record.get("bound") is None:
            return None
        streams.add(record["stream"])
        ends.append(max(record["bound"], took[1]))
        took_ends.append(took[1] if ended else ends[-1])
    if len(streams) != 1:
        return None
    return Reach(stream=streams.pop(), end=max(ends), taken=max(took_ends), ended_checked=True,
                 ended_by_controller=True)


def merged(positions: dict[str, int], records: Iterable[tuple[str, str]], ended: set[str] | None = None
           ) -> dict[str, int]:
    """``positions`` with each record's end (``taken_end``) where it is further on; ``records``: (where it was read,
    its text). With ``ended`` (the records, by where, of attempts whose runtime saw them end), a record not among them
    counts for its ``attempt_bound`` (else its ``bound``) where that is further on: its attempt may still be sending
    past what it says. One that is not a record is passed over, with a warning."""
    out = dict(positions)
    for where, text in records:
        found = taken_end(text)
        if found is None:
            passed_over(where, f"not a record of prompt positions (positions are 0 to {MAX_POSITION})")
            continue
        stream, end = found
        if ended is not None and where not in ended:
            record = _record(text) or {}
            share = record.get("attempt_bound", record.get("bound"))
            end = max(end, share if share is not None else end)
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

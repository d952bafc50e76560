"""The threads that drive hosts for one evaluation, and the hosts each drives.

After an interrupt the controller stops them (no new round starts; a local command is ended; the SSH channels are
closed by the caller), waits for them, and then cleans only the hosts that no thread still drives: a folder removed
under a round that still runs would lose its records, or be written again half.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import NamedTuple, TypeVar

from flagperf.errors import FlagperfError

T = TypeVar("T")


class RoundsStopped(FlagperfError):
    """The evaluation is stopping (an interrupt): a host's thread starts nothing more."""


# What a stopped case's state keeps of its log (CaseStopped.keep_tail): its case.log has it all
STOPPED_TAIL_LINES = 50
STOPPED_TAIL_BYTES = 4096  # UTF-8


class CaseStopped(RoundsStopped):
    """The evaluation's stop ended a round's case process (a container its watcher killed), and its runtime saw it
    end: its ``exit_code``, so that the controller records the end (tasks.container.seen_ended: the attempt's record
    of prompt positions is final, not held at its bound), and the ``lines`` it printed (its case.log); ``logged``:
    whether its case.log holds them."""

    def __init__(self, message: str, exit_code: int, lines: list[str] | None = None, logged: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.lines = list(lines or [])
        self.logged = logged

    def keep_tail(self) -> None:
        """Keep only the end of ``lines`` (STOPPED_TAIL_LINES, STOPPED_TAIL_BYTES in all as UTF-8; a longer last line
        by its end) where its case.log holds them all (``logged``): the error goes on into a Cancelled state's data,
        stored and shown by Prefect, which a whole log would swell. Where its case.log could not be written the lines
        stay whole: the state is their only copy."""
        if not self.logged:
            return
        kept: list[str] = []
        size = 0
        for line in reversed(self.lines[-STOPPED_TAIL_LINES:]):
            encoded = line.encode("utf-8", "replace")  # any str: a lone surrogate counts as a "?"
            if size + len(encoded) > STOPPED_TAIL_BYTES:
                if not kept:  # its end, cut on a character's boundary
                    kept.append(encoded[-STOPPED_TAIL_BYTES:].decode("utf-8", "ignore"))
                break
            kept.append(line)
            size += len(encoded)
        self.lines = kept[::-1]

    def __reduce__(self) -> tuple[type[CaseStopped], tuple[str, int, list[str], bool]]:
        # args holds only the message: pickle (Prefect's result and state storage) and deepcopy call the class again
        return type(self), (str(self), self.exit_code, self.lines, self.logged)


class Unstopped(NamedTuple):
    """What a host's thread could not stop at the stop: ``what`` (e.g. "host-round/host-round run ID"), ``ref`` to
    stop it by hand with (the run's id), and ``why``."""

    host: str
    what: str
    ref: str
    why: str


class HostThreads:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._driving: dict[object, tuple[threading.Thread, tuple[str, ...]]] = {}
        self._stopping = threading.Event()
        self._unstopped: list[Unstopped] | None = []  # None once taken (take_unstopped)

    def run(self, hosts: Sequence[str], call: Callable[[], T]) -> T:
        """``call`` in this thread, counted as driving ``hosts`` until it returns; refused once stopping."""
        token = object()  # one entry per call: a thread may run a nested call for the same hosts
        with self._changed:
            if self._stopping.is_set():
                raise RoundsStopped(f"the run is stopping: nothing more starts on {', '.join(hosts)}")
            self._driving[token] = (threading.current_thread(), tuple(hosts))
        try:
            return call()
        finally:
            with self._changed:
                del self._driving[token]
                self._changed.notify_all()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_stopping(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the stop; whether it came."""
        return self._stopping.wait(timeout_s)

    def note_unstopped(self, unstopped: Unstopped) -> bool:
        """Something of a host that its thread could not stop at the stop (a run dispatched to its worker), for one
        line that names them all once the threads have ended (take_unstopped); False once that line was said (a
        thread that outlived the wait): the caller says it alone."""
        with self._changed:
            if self._unstopped is None:
                return False
            self._unstopped.append(unstopped)
            return True

    def take_unstopped(self) -> list[Unstopped]:
        """What the threads noted they could not stop (note_unstopped); later notes are said by their threads
        alone."""
        with self._changed:
            taken, self._unstopped = self._unstopped or [], None
            return taken

    def busy(self) -> dict[str, list[str]]:
        """The hosts some thread still drives, each with those threads' names."""
        with self._changed:
            found: dict[str, list[str]] = {}
            for thread, hosts in self._driving.values():
                for host in hosts:
                    found.setdefault(host, [])
                    if thread.name not in found[host]:
                        found[host].append(thread.name)
            return found

    def wait(self, timeout_s: float) -> dict[str, list[str]]:
        """Wait (at most ``timeout_s``) until no thread drives a host; the hosts still driven (busy())."""
        with self._changed:
            self._changed.wait_for(lambda: not self._driving, timeout=timeout_s)
        return self.busy()


# The current evaluation's threads: set by the evaluation, inherited by the threads it starts (copy_context).
HOST_THREADS: ContextVar[HostThreads | None] = ContextVar("flagperf_host_threads", default=None)


def stop_requested() -> bool:
    """Whether the evaluation this thread works for is stopping: a long wait checks it to end early."""
    threads = HOST_THREADS.get()
    return threads is not None and threads.stopping

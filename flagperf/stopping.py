"""Signals while a command cleans up after an interrupt: a second is noted, not raised, so that the clean-up (a
history write, a verdict file, a report) is not cut short; a third is the way out of a clean-up that hangs (a
database that does not answer): one line saying what may be left, then the signal's default action."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_NOW_AT = 3  # the signal (counting the one that began the clean-up) that stops without more clean-up


# The signals taken since the command began, by its handler and by every clean-up block. One count per process is
# one per command that signals reach: they arrive on the main thread, where only the command that runs there has
# handlers installed (a command in another thread installs none, and resets nothing).
_taken: list[int] = []


def reset() -> None:
    """A command begins: no signal taken yet."""
    _taken.clear()


def take(signum: int) -> int:
    """Count a signal the command took (whichever handler took it); how many it has taken in all."""
    _taken.append(signum)
    return len(_taken)


def stop_now(signum: int, left: str) -> None:
    """End the process by ``signum`` as if no handler were installed, after one line: what may be left. Written
    with os.write: the signal may land while the process is itself writing to stderr (a buffered write would
    raise a reentrant-call error into the clean-up instead of stopping)."""
    os.write(2, f"stopping now: {left}\n".encode(errors="replace"))
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def put_back(before: dict[int, Any]) -> None:
    """The handlers of before, each again; one installed outside Python (None) is the default action again."""
    for sig, handler in before.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextmanager
def signals_noted(left: str, seen: int = 1) -> Iterator[list[int]]:
    """SIGINT and SIGTERM are only noted inside the block (the list yielded), whatever handler was there: inside
    a flow run Prefect's raises TerminationSignal on every SIGTERM. ``seen``: the signals already taken before
    the block; the third in all stops now (``stop_now`` with ``left``). The handlers of before are put back.
    Signal handlers exist in the main thread only: elsewhere the block runs as it is."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, _frame: Any) -> None:
        noted.append(signum)
        # the command's count, across its handler and every block; ``seen`` where the first was not its own
        # (Prefect's handler took it inside a flow run)
        if max(take(signum), seen + len(noted)) >= STOP_NOW_AT:
            stop_now(signum, left)

    before = {sig: signal.signal(sig, note) for sig in SIGNALS}
    try:
        yield noted
    finally:
        put_back(before)

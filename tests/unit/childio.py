"""A child process's output, read by tests with deadlines of their own: a child that hangs before it says what a
test waits for (its header, a pid, a banner line) fails that test with what it said so far, instead of hanging
the test run and CI. A plain ``readline()`` or ``read()`` on its pipe waits as long as the child (or anything it
started that holds the pipe) does."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from typing import IO, Any

LINE_DEADLINE_S = 120.0  # generous: a guard against a hang, not a timing assumption


class Lines:
    """The lines of a child's text stream (its stdout), read by a thread as they come. Once a ``Lines`` reads a
    stream, read that stream only through it."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "the child's output is not a pipe"
        self.said: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._ended = False
        self._error: Exception | None = None  # what ended the reading other than the stream's end: raised to the test
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for line in iter(stream.readline, ""):
                self._queue.put(line)
        except UnicodeDecodeError as exc:  # output that is not text: not an end to take as the child's
            self._error = exc
        except (OSError, ValueError):  # closed meanwhile
            pass
        finally:
            self._queue.put(None)

    def next(self, deadline_s: float = LINE_DEADLINE_S) -> str:
        """The next line; "" once the stream has ended. Fails the test when none comes within ``deadline_s``;
        raises what stopped the reading where that was no end (output that cannot be decoded)."""
        if self._ended:
            if self._error is not None:
                raise self._error
            return ""
        try:
            line = self._queue.get(timeout=max(deadline_s, 0.0))
        except queue.Empty:
            raise AssertionError(f"no line from the child within {deadline_s:.0f} s; it said so far:\n"
                                 f"{self.text()}") from None
        if line is None:
            self._ended = True
            if self._error is not None:
                raise self._error
            return ""
        self.said.append(line)
        return line

    def rest(self, deadline_s: float = LINE_DEADLINE_S) -> str:
        """Every line until the stream ends (the child, and whatever it started that holds the stream, ended),
        within ``deadline_s`` in all; returns them."""
        start, deadline = len(self.said), time.monotonic() + deadline_s
        while self.next(deadline - time.monotonic()):
            pass
        return "".join(self.said[start:])

    def text(self) -> str:
        """Everything read so far."""
        return "".join(self.said)


def output_of(proc: subprocess.Popen[Any], timeout_s: float = 60.0) -> str:
    """What a child that has ended wrote to its stdout pipe and nobody read yet, for an assertion's message: read
    within a deadline (a process it started may still hold the pipe open, where ``read()`` would wait for it)."""
    if proc.stdout is None:
        return ""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"(its output: still held open {timeout_s:.0f} s after it ended, by a process it started)"
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""

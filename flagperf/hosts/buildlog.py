"""An image build's output as a vendor needs it when the build fails: which instruction of which Dockerfile (its
line number) and what that instruction printed last (pip's "No matching distribution for ...", a script's
error), in one line, instead of the engine's bare "returned a non-zero code: 1"."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from pathlib import Path

from flagperf.config.files import read_config_text
from flagperf.errors import ConfigError
from flagperf.paths import display_path

# The classic builder's progress line for each instruction: "Step 3/4 : RUN bash /opt/flagperf/install.sh".
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
# Builder chatter between a step and its output, never the output itself.
CHATTER = re.compile(r"^(---> |Removing intermediate container |Successfully )")
KEPT_LINES = 3


def instruction_lines(text: str) -> list[int]:
    """The 1-based line where each instruction of a Dockerfile starts, in order (the builder's step numbers):
    comments and blank lines skipped, a line ending in a backslash continued by the next (comments between)."""
    starts: list[int] = []
    continued = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # also inside a continued instruction, which goes on
            continue
        if not continued:
            starts.append(number)
        continued = stripped.endswith("\\")
    return starts


class BuildTranscript:
    """A build's line sink: passes every line on, and keeps the current step and its last output lines."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink
        self.step: int | None = None
        self.instruction = ""
        self.output: deque[str] = deque(maxlen=KEPT_LINES)

    def __call__(self, line: str) -> None:
        self.sink(line)
        for part in line.splitlines():
            found = STEP.match(part.strip())
            if found:
                self.step, self.instruction = int(found.group(1)), found.group(3).strip()
                self.output.clear()
            elif part.strip() and not CHATTER.match(part.strip()):
                self.output.append(part.strip())

    def failure(self, dockerfile: Path, error: str) -> str:
        """One line: the Dockerfile and line of the failed instruction, the engine's error, the last output."""
        where = display_path(dockerfile)
        if self.step is not None:
            try:
                starts = instruction_lines(read_config_text(dockerfile, what="a Dockerfile"))
            except ConfigError:  # changed since the build read it: the instruction alone says enough
                starts = []
            if 0 < self.step <= len(starts):
                where += f" line {starts[self.step - 1]}"
            where += f" ({self.instruction[:120]})"
        last = " | ".join(self.output)
        message = f"image build failed at {where}: {' '.join(error.split())}"
        return message + (f"; its last output: {last[:400]}" if last else "")

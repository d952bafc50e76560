"""Error types. Every user-facing error renders as one line that names the file and the key."""

from __future__ import annotations

MAX_LINE = 500  # an error line stays readable, whatever value it quotes


class FlagperfError(Exception):
    """Base for errors a user can act on; the CLI prints them as one line, never as a traceback."""


class ConfigError(FlagperfError):
    """A configuration value or file is wrong. ``source`` is a file path (or '--set'), ``key`` a dotted key."""

    def __init__(self, source: object, key: str | None, message: str) -> None:
        self.source = str(source)
        self.key = key
        self.message = message
        where = f"{self.source}: {key}" if key else self.source
        line = " ".join(f"{where}: {message}".split())  # one line, whatever a message quoted
        super().__init__(line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "...")


class CaseUserError(FlagperfError):
    """Raised by case code for a bad input (not retried: running it again gives the same answer)."""


class Unsupported(FlagperfError):
    """The device cannot do what the case asks (for example a precision it has no arithmetic for)."""


class InfrastructureFailure(FlagperfError):
    """A crash, a timeout or a lost result: worth retrying, the case itself may be fine."""


class RoundUserFailure(FlagperfError):
    """A round failed because of its inputs: retrying would fail the same way."""


# Exit codes of the in-host entry (`python -m flagperf.entry`). Anything else is a crash.
EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_UNSUPPORTED = 3

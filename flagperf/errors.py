"""Error types. Every user-facing error renders as one line that names the file and the key."""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

MAX_LINE = 500  # an error line stays readable, whatever value it quotes
LISTED_IN_FULL = 12  # more known names than this: the error says which command lists them (the line would be cut)


class FlagperfError(Exception):
    """Base for errors a user can act on; the CLI prints them as one line, never as a traceback."""


class ConfigError(FlagperfError):
    """A configuration value or file is wrong. ``source`` is a file path (or '--set'), ``key`` a dotted key.
    ``more``: further findings of the same check (the CLI prints each on its own line: validate, run and nightly
    alike; ``str()`` of the error is the first one alone)."""

    def __init__(self, source: object, key: str | None, message: str) -> None:
        self.source = str(source)
        self.key = key
        self.message = message
        self.more: list[ConfigError] = []
        self.left_out = 0  # findings found beyond those in ``more`` (MAX_FINDINGS), counted, not listed
        where = f"{printable(self.source)}: {printable(key)}" if key else printable(self.source)  # names, as written
        super().__init__(one_line(message, lead=f"{where}:"))


# What a line may not show raw: line and paragraph separators (a new line to some terminals and editors) and the
# bidi overrides and isolates (they reorder what follows, so a name could read as another: U+202E).
UNSAFE = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """``text`` (a file name from a folder scan, here or on another host) fit for a one-line message and for any JSON
    encoder, and read back unambiguously: a byte that is no UTF-8 (a lone surrogate, as Python reads such a name) as
    \\xNN, a control character (a newline, a tab, ESC) or another character that could break or reorder the line
    (UNSAFE) escaped as Python writes it (\\n, \\u202e), a backslash doubled (so that a name holding a backslash and
    an n is not read as one holding a newline); the rest as it is, format characters a name may hold (a zero-width
    joiner, a soft hyphen) and spaces other than ' ' included."""
    return _escaped(text, backslash=True)


def _escaped(text: str, backslash: bool) -> str:
    shown = []
    for char in text:
        if char == "\\":
            shown.append("\\\\" if backslash else char)
        elif "\udc80" <= char <= "\udcff":  # surrogateescape's: the byte the name holds
            shown.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif char in UNSAFE or unicodedata.category(char) in ("Cc", "Cs"):
            shown.append(char.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            shown.append(char)
    return "".join(shown)


SHORTEST_PART = 40  # a long path or value is shortened to no less than this (its start and its end stay)
ELLIPSIS = "..."


def one_line(text: str, limit: int = MAX_LINE, lead: str = "") -> str:
    """``lead`` and ``text`` as one line of at most ``limit`` characters, each word printable (a control character
    escaped: paths.printable). A line too long loses, in this order and only as far as it must: the middles of the
    message's longest words (a deep path keeps its start and its file's name), except those of its last clause
    (after its final ';' or ':', where it says what to do: a command it suggests stays copyable); those of ``lead``
    (the file and key an error names) where the lead alone takes more than half the line; the middle of the message
    between the lead and that last clause; the middles of the last clause's longest words; those of the lead; and
    only where none of it is enough, the middle of the line. Its end is never cut."""
    # Words are what ' ' parts: any other space, a tab or a newline is part of a word, escaped there (a name holding
    # one is shown as it is, never as another name with a plain space), and two spaces stay two. A backslash is left
    # as it is: a message's names come escaped by printable already (or by repr), and escaping again would double it.
    lead_words = [_escaped(word, backslash=False) for word in lead.strip(" ").split(" ")] if lead.strip(" ") else []
    message = [_escaped(word, backslash=False) for word in text.strip(" ").split(" ")] if text.strip(" ") else []
    clause = max((i + 1 for i, word in enumerate(message) if word.endswith((";", ":"))), default=len(message))
    words = [*lead_words, *message]
    lead_end, body_end = len(lead_words), len(lead_words) + clause
    body, tail, lead_part = range(lead_end, body_end), range(body_end, len(words)), range(lead_end)

    length = [sum(map(len, words)) + max(len(words) - 1, 0)]  # the line's, kept as words change: no join per step

    def excess() -> int:
        return length[0] - limit

    def shorten(indexes: range) -> None:
        """The longest of these words lose their middles until the line fits or none is worth shortening."""
        while excess() > 0:
            longest = max(indexes, key=lambda i: len(words[i]), default=None)
            if longest is None or len(words[longest]) <= SHORTEST_PART + len(ELLIPSIS):
                return  # shortening it would not shorten the line
            word = words[longest]
            keep = max(SHORTEST_PART, len(word) - excess() - len(ELLIPSIS))
            head = keep // 3  # the end of a path (its file's name) says more than its start
            words[longest] = word[:head] + ELLIPSIS + word[len(word) - (keep - head):]
            length[0] += len(words[longest]) - len(word)

    def middle_cut() -> str | None:
        """The line with the middle of the message before its last clause cut, the lead and that clause whole."""
        kept = " ".join(words[:lead_end]), " ".join(words[lead_end:body_end]), " ".join(words[body_end:])
        room = limit - len(kept[0]) - len(kept[2]) - (kept[0] != "") - (kept[2] != "")
        if room < SHORTEST_PART + len(ELLIPSIS) + 2 or len(kept[1]) <= room:
            return None  # too little of the message would be left to say anything, or cutting it is not enough
        head = (room - len(ELLIPSIS) - 2) // 2
        end = kept[1][len(kept[1]) - (room - head - len(ELLIPSIS) - 2):]
        cut = f"{kept[1][:head].rstrip()} {ELLIPSIS} {end.lstrip()}"
        return " ".join(part for part in (kept[0], cut, kept[2]) if part)

    shorten(body)
    lead_long = len(" ".join(words[:lead_end])) > limit // 2
    if lead_long:
        shorten(lead_part)
    if excess() <= 0:
        return " ".join(words)
    cut = middle_cut()
    if cut is not None:
        return cut
    shorten(tail)
    if not lead_long:
        shorten(lead_part)
    line = " ".join(words)
    if len(line) <= limit:
        return line
    cut = middle_cut()
    if cut is not None:
        return cut
    head = (limit - len(ELLIPSIS) - 2) // 2
    return f"{line[:head]} {ELLIPSIS} {line[len(line) - (limit - head - len(ELLIPSIS) - 2):]}"


MAX_FINDINGS = 20  # findings of one check listed at most (a list of a thousand bad items is not a thousand lines)


def _copied(error: ConfigError) -> ConfigError:
    """A copy of ``error`` (its class, its fields, its cause) whose ``more`` and ``left_out`` may be set without
    touching the error itself, which others may hold (the plan shares one case's findings across cases)."""
    copy = type(error).__new__(type(error), *error.args)
    copy.__dict__.update(error.__dict__)
    copy.__cause__, copy.__suppress_context__ = error.__cause__, error.__suppress_context__
    return copy


def gathered(errors: Iterable[ConfigError]) -> ConfigError:
    """Several findings as one error: a copy of the first, carrying copies of the others (and theirs) in ``more``,
    each once. The errors given are left as they were: one held elsewhere too never carries another's findings."""
    flat: list[ConfigError] = []
    seen: set[tuple[str, str | None, str]] = set()  # by what it says, not its line: two long lines may read alike
    left_out = 0  # what the errors gathered had already left out (cut at MAX_FINDINGS themselves)
    for error in errors:
        if finding_key(error) not in seen:  # a copy of an error already gathered left out the same
            left_out += getattr(error, "left_out", 0)
        for finding in (error, *error.more):
            if finding_key(finding) not in seen:
                seen.add(finding_key(finding))
                flat.append(finding)
    if not flat:
        raise ValueError("gathered() needs at least one error")
    first = _copied(flat[0])
    first.more = [_copied(finding) for finding in flat[1:MAX_FINDINGS]]
    first.left_out = left_out + max(0, len(flat) - MAX_FINDINGS)
    for finding in first.more:
        finding.more, finding.left_out = [], 0
    return first


def finding_key(error: FlagperfError) -> tuple[str, str | None, str]:
    """What tells one finding from another: its file, key and message (a ConfigError's), else its line."""
    if isinstance(error, ConfigError):
        return error.source, error.key, error.message
    return type(error).__name__, None, str(error)


def left_out_line(error: FlagperfError) -> str | None:
    """The line after an error's listed findings that says how many more there are, if any."""
    left = getattr(error, "left_out", 0)
    return f"... and {left} more finding{'s' if left != 1 else ''} (not listed: fix these and check again)" \
        if left else None


def findings(error: FlagperfError) -> list[FlagperfError]:
    """Every finding an error carries: itself, then those in its ``more``."""
    return [error, *getattr(error, "more", [])]


def validation_message(error: Mapping[str, Any]) -> str:
    """A pydantic error's message in the validator's own words: without the "Value error, " or "Assertion
    failed, " pydantic puts before a ValueError's or an assert's text."""
    raised = (error.get("ctx") or {}).get("error")
    if error.get("type") in ("value_error", "assertion_error") and isinstance(raised, BaseException) and str(raised):
        return str(raised)
    return str(error.get("msg", "")).removeprefix("Value error, ").removeprefix("Assertion failed, ")


def nearest(name: str, names: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """The names a typo of ``name`` most likely meant, best first; a name differing only in letter case alone.
    ``cutoff``: how alike (difflib's ratio) a name must be; higher where a match decides what a file is."""
    folded = {known.casefold(): known for known in names}
    if name.casefold() in folded:
        return [folded[name.casefold()]]
    return [folded[match] for match in difflib.get_close_matches(name.casefold(), list(folded), n=3, cutoff=cutoff)]


def unknown_name(kind: str, name: str, known: Iterable[str], listed_by: str | None = None) -> str:
    """The message for a ``name`` that is not one of ``known``: the closest names first (a typo is the usual
    cause), then the known ones, or, when they are too many for one line, the command that lists them."""
    names = sorted(set(known))
    close = nearest(name, names)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    if listed_by and len(names) > LISTED_IN_FULL:
        return f"unknown {kind} {name!r} ({hint}{len(names)} known: `{listed_by}` lists them)"
    return f"unknown {kind} {name!r} ({hint}known: {', '.join(names)})"


class CaseUserError(FlagperfError):
    """Raised by case code for a bad input (not retried: running it again gives the same answer)."""


class Unsupported(FlagperfError):
    """The device cannot do what the case asks (for example a precision it has no arithmetic for)."""


class SpecSettingError(ValueError):
    """Raised by a vendor's spec module for one spec_settings value it cannot use; the engine says which file
    and key gave it (the vendor's vendor.yaml, or the inventory for this host)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"spec_settings.{key}: {message}")


# A URL's user and password (scheme://user:password@host): PREFECT_API_URL may hold them, and the messages of the
# clients that use it (httpx's, requests', Prefect's states built from them) name the whole URL.
USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"<>]*@")


def redact_userinfo(text: str) -> str:
    """``text`` with every URL's user and password (``scheme://user:password@``) shown as ``scheme://***@``: for a
    message from elsewhere (a client's error, a flow run's state) that goes on into results and logs."""
    return USERINFO.sub(r"\1***@", text)


def error_line(exc: object) -> str:
    """An exception (or an engine's explanation) in one line: its type and its message's first line. An HTTP error
    answered by a server (httpx's HTTPStatusError, Prefect's, and Prefect's ObjectNotFound and ObjectAlreadyExists,
    which wrap one) is its status code and reason alone: its message names the whole URL, which may hold a user and
    password (PREFECT_API_URL), and it goes on into results and logs; any other message has a URL's user and password
    masked (redact_userinfo)."""
    kind = type(exc).__name__ if isinstance(exc, BaseException) else ""
    wrapped = getattr(exc, "http_exc", None)  # Prefect's ObjectNotFound: its own message is often "None"
    response = getattr(wrapped if isinstance(wrapped, BaseException) else exc, "response", None)
    status, reason = getattr(response, "status_code", None), getattr(response, "reason_phrase", None)
    if isinstance(status, int) and isinstance(reason, str):  # an httpx Response (requests' has .reason instead)
        detail = f"{status} {reason}".strip()
    else:
        text = redact_userinfo(str(exc).strip()).splitlines()
        detail = text[0] if text else ""
    return f"{kind}: {detail}" if kind and detail else kind or detail


class InfrastructureFailure(FlagperfError):
    """A crash, a timeout or a lost result: worth retrying, the case itself may be fine."""


class RoundUserFailure(FlagperfError):
    """A round failed because of its inputs: retrying would fail the same way."""


# Exit codes of the in-host entry (`python -m flagperf.entry`). Anything else is a crash.
EXIT_OK = 0
EXIT_USER_ERROR = 2
EXIT_UNSUPPORTED = 3


# Optional packages and the extra of the distribution that installs each. The default install runs the
# base-spec cases; data readers, model definitions, inference engines, the PostgreSQL driver and NVML come
# with extras, so a missing one must say which extra to install, in one line.
DISTRIBUTION = "flagperf-prefect"

# import name -> (package, extra). None: the case family's extra (several families' extras carry it).
OPTIONAL: dict[str, tuple[str, str | None]] = {
    "sklearn": ("scikit-learn", None),
    "PIL": ("pillow", None),
    "transformers": ("transformers", None),
    "onnx": ("onnx", "inference"),
    "onnxruntime": ("onnxruntime", "inference"),
    "mlperf_loadgen": ("mlcommons-loadgen", "inference"),
    "psycopg": ("psycopg", "postgres"),
    "pynvml": ("nvidia-ml-py", "nvidia"),
    "rouge_score": ("rouge-score", "generate"),
    "openai": ("openai", "generate"),  # transformers serve's request types
    "accelerate": ("accelerate", "generate"),  # transformers serve loads with device_map
}
FAMILY_EXTRA = {"training": "training", "inference": "inference", "generate": "generate"}
DEFAULT_EXTRA = "training"  # a shared package needed outside a training or inference case


class MissingExtra(CaseUserError):
    """An optional package is not installed: the input is fine, the install lacks an extra (not retried)."""

    def __init__(self, package: str, extra: str, needed_by: str | None = None) -> None:
        self.package, self.extra = package, extra
        who = f"{needed_by} needs" if needed_by else "needs"
        super().__init__(f"{who} {package}, which is not installed: {install_command(extra)}")


def install_command(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_for(import_name: str, family: str | None = None) -> tuple[str, str] | None:
    """(package, extra) for a top-level import name, or None when no extra provides it."""
    known = OPTIONAL.get(import_name.partition(".")[0])
    if known is None:
        return None
    package, extra = known
    return package, extra or FAMILY_EXTRA.get(family or "", DEFAULT_EXTRA)


def missing_extra(exc: ImportError, family: str | None = None, needed_by: str | None = None
                  ) -> MissingExtra | None:
    """The MissingExtra for an import that failed because an extra is not installed, else None (a real bug
    or a broken install is not hidden behind an install hint)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    found = extra_for(exc.name, family)
    return MissingExtra(found[0], found[1], needed_by) if found else None


def require(import_name: str, family: str | None = None, needed_by: str | None = None) -> None:
    """Fail with the install hint unless ``import_name`` imports."""
    try:
        __import__(import_name)
    except ImportError as exc:
        error = missing_extra(exc, family, needed_by)
        if error is None:
            raise
        raise error from None

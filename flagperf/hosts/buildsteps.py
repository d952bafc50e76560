"""What a vendor's image build does, read (never run) for vendor check: a Dockerfile's instructions as Docker joins
them (continuation lines, heredoc bodies, comment lines dropped), and the shell words of a RUN step or an install
script, with the paths those steps write (so a packages/ file the build downloads is not said to be missing) and
whether they download anything. Read loosely on purpose: what cannot be parsed makes the check say less, never
more."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# <<EOF, <<-EOF, <<"EOF", <<'EOF': Docker's (BuildKit) heredocs, whose body lines follow the instruction.
HEREDOC = re.compile(r"(?<!<)<<(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
# A shell variable in a path: $NAME or ${NAME}; anything more ($(...), ${NAME:-x}) makes the path unknowable here.
VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}
REDIRECTS = {">", ">>", ">|", "&>", "&>>"}
# Words before the command itself.
PREFIXES = {"sudo", "env", "exec", "time", "then", "do", "else", "elif", "if", "while", "until", "!", "nohup", "{"}
# The options whose value is a path the command writes, per command (the value may be attached: -Ox, --dest=x).
WRITING_OPTIONS = {
    "wget": {"-O", "-P", "--output-document", "--directory-prefix"},
    "curl": {"-o", "--output", "--output-dir"},
    "pip": {"-d", "--dest", "-w", "--wheel-dir"},
    "tar": {"-C", "--directory"},
    "unzip": {"-d"},
    "cp": {"-t", "--target-directory"},
    "mv": {"-t", "--target-directory"},
}
ALL_ARGUMENTS = {"mkdir", "touch", "tee"}  # every argument is written
LAST_ARGUMENT = {"cp", "mv", "ln", "rsync", "install"}  # the destination
# shlex takes time quadratic in a word's length (a 1.6 MB word: minutes) and a script may be 16 MiB: a logical line
# longer than this is split at blanks instead (what it names is still looked for, quotes left on).
SHLEX_LIMIT = 8192
PACKAGES = "packages"  # FlagPerf's folder beside the Dockerfile (vendor check's PACKAGES_FOLDER)
# A local archive ADD unpacks (Docker's ADD extracts tar, gzip, bzip2 and xz archives).
ARCHIVE = re.compile(r"\.(?:tar|tgz|tbz2?|txz|tar\.(?:gz|bz2|xz|zst))$", re.IGNORECASE)


@dataclass(frozen=True)
class Instruction:
    line: int  # where it starts
    keyword: str  # upper case: Docker reads RUN and run alike
    text: str  # its arguments, continuation lines joined; each heredoc's body after a newline


def dockerfile_instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions as Docker reads them: a line ending in a backslash goes on with the next (comment
    and empty lines inside are dropped), a line starting with # is a comment, and each heredoc's body (up to its
    end word) belongs to the instruction that opened it."""
    lines = text.removeprefix("\ufeff").splitlines()  # a BOM (some Windows editors write one) is not text
    found: list[Instruction] = []
    index = 0
    while index < len(lines):
        start, parts = index + 1, [lines[index]]
        index += 1
        if not parts[0].strip() or parts[0].lstrip().startswith("#"):
            continue
        while parts[-1].rstrip().endswith("\\") and index < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1]
            # comment and empty lines inside an instruction are dropped; it goes on with the line after them
            while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
                index += 1
            if index < len(lines):
                parts.append(lines[index])
                index += 1
        logical = " ".join(part.strip() for part in parts)
        keyword, rest = [*logical.split(None, 1), ""][:2]
        bodies = []
        for match in HEREDOC.finditer(rest) if keyword.upper() in ("RUN", "COPY", "ADD") else ():
            body = []
            while index < len(lines):
                line = lines[index]
                index += 1
                if (line.lstrip("\t") if match.group(1) else line) == match.group(3):
                    break
                body.append(line)
            bodies.append("\n".join(body))
        found.append(Instruction(start, keyword.upper(), "\n".join([rest.strip(), *bodies])))
    return found


# RUN's own flags before its command: --mount=..., --network=host, --security=insecure.
RUN_FLAGS = re.compile(r"\A(?:--[A-Za-z][A-Za-z0-9-]*(?:=\S*)?\s+)+")
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh"}


def run_script(text: str) -> str:
    """A RUN instruction's text (Instruction.text) as the shell script it runs: its flags (--mount=...) dropped,
    and the exec form (a JSON list of words) as one line of those words quoted, or, where it is a shell's -c, that
    script itself."""
    text = RUN_FLAGS.sub("", text)
    first, newline, after = text.partition("\n")
    heredoc = HEREDOC.search(first)
    if heredoc:
        # The bodies are shell only where a heredoc is the script itself (RUN <<EOF, RUN bash -e <<EOF); one fed to
        # a command (cat <<EOF > /etc/pip.conf) is data: its lines are not commands, nor paths the build names.
        head = first[:heredoc.start()].split()
        if not (not head or (PurePosixPath(head[0]).name in SHELLS and all(w.startswith("-") for w in head[1:]))):
            return first
    if not first.startswith("["):
        return text
    try:
        words = json.loads(first)
    except ValueError:
        return text
    if not isinstance(words, list) or not words or not all(isinstance(word, str) for word in words):
        return text
    if (len(words) >= 3 and PurePosixPath(words[0]).name in SHELLS
            and re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", words[1])):
        script = words[2]
    else:
        script = shlex.join(words)
    return script + newline + after


def shell_lines(text: str) -> list[tuple[int, str]]:
    """A script's logical lines (a backslash at the end goes on with the next), each with its first line's number."""
    found: list[tuple[int, str]] = []
    lines = text.removeprefix("\ufeff").splitlines()
    index = 0
    while index < len(lines):
        start, line = index + 1, lines[index]
        index += 1
        while line.endswith("\\") and index < len(lines):
            line = line[:-1] + " " + lines[index]
            index += 1
        found.append((start, line))
    return found


def _without_comment(line: str) -> str:
    """``line`` up to its comment: a # that starts a word outside quotes (a # inside a word or quotes is kept)."""
    quote, escaped = "", False
    for position, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1] in " \t;&|()"):
            return line[:position]
    return line


def shell_words(line: str) -> list[str]:
    """One logical line's words, quotes removed, operators (; && | > ...) as words of their own; a line the shell
    grammar cannot split (an unclosed quote), or one longer than SHLEX_LIMIT, split at blanks."""
    line = _without_comment(line)
    if len(line) > SHLEX_LIMIT:
        return line.split()
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return line.split()


def as_glob(word: str) -> str | None:
    """A path word with each $VAR / ${VAR} as * (a glob of what it may be), ./ and a trailing / dropped; None where
    what is left still depends on the shell ($(...), ${VAR:-x}, {a,b})."""
    # ${A}${B} would be **, which Path.glob takes only as a whole path component: one * is the same glob here
    globbed = re.sub(r"\*{2,}", "*", VARIABLE.sub("*", word))
    if re.search(r"[${}`]", globbed):
        return None
    while globbed.startswith("./"):
        globbed = globbed[2:]
    return globbed.rstrip("/") or None


def copy_parts(instruction: Instruction) -> tuple[list[str], list[str], str] | None:
    """A COPY or ADD step's flags (--from=..., --chown=...), sources and destination, in either of Docker's forms
    (``COPY a b /dst`` or ``COPY ["a", "b", "/dst"]``, the flags before either); None where it names no source
    and destination."""
    rest = instruction.text.partition("\n")[0].strip()
    flags: list[str] = []
    while rest.startswith("--"):  # the flags come first; what follows them is the shell or the JSON form
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    paths: list[str] | None = None
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(word, str) for word in parsed):
            paths = parsed
    if paths is None:
        paths = shell_words(rest)
    if len(paths) < 2:
        return None
    return flags, paths[:-1], paths[-1]


@dataclass
class BuildWrites:
    """What the steps read so far write (paths, as globs) and whether any downloads (wget, curl, pip download or
    wheel): a packages/ path not found may then be made by the build itself."""

    written: list[str] = field(default_factory=list)
    downloads: bool = False
    # Files land where this reading cannot tell (COPY --from, ADD of a URL or an archive, tar x without -C, unzip
    # without -d): a packages/ path not found may be one of them.
    unknown_places: bool = False

    def read(self, words: Iterable[str]) -> None:
        for command in _commands(list(words)):
            self._command(command)

    def copy(self, instruction: Instruction) -> None:
        """A COPY or ADD step: its destination is written. A relative one is under WORKDIR, which the RUN steps
        are in as well; of an absolute one, the part from a packages component on is what a RUN step in WORKDIR
        may name (COPY x /workspace/packages with WORKDIR /workspace), read leniently."""
        parts = copy_parts(instruction)
        if parts is None:
            return
        flags, sources, destination = parts
        if any(flag.startswith("--from") for flag in flags):
            self.unknown_places = True
        elif instruction.keyword == "ADD" and any(re.match(r"[A-Za-z][A-Za-z0-9+.-]*://|git@", source)
                                                  or ARCHIVE.search(source) for source in sources):
            self.unknown_places = True  # ADD fetches a URL and unpacks a local tar archive
        elif all((as_glob(source) or "").split("/")[0] == PACKAGES for source in sources):
            # packages/ copied from the context: what the destination holds is what the check looks for there
            return
        if HEREDOC.search(destination):
            return
        parts = destination.split("/")
        if destination.startswith("/"):
            if PACKAGES not in parts:
                return
            parts = parts[parts.index(PACKAGES):]
        self._wrote("/".join(parts))

    def _command(self, words: list[str]) -> None:
        rest: list[str] = []
        index = 0
        while index < len(words):
            word = words[index]
            if word in REDIRECTS and index + 1 < len(words):
                self._wrote(words[index + 1])
                index += 2
                continue
            if word in {"<", "<<", "<<<"}:
                index += 2
                continue
            rest.append(word)
            index += 1
        while rest and (rest[0] in PREFIXES or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", rest[0])):
            rest = rest[1:]
        if not rest:
            return
        name = PurePosixPath(rest[0]).name
        arguments = rest[1:]
        if re.fullmatch(r"python[0-9.]*", name) and arguments[:2] == ["-m", "pip"]:
            name, arguments = "pip", arguments[2:]
        name = "pip" if re.fullmatch(r"pip[0-9.]*", name) else name
        if name in ("wget", "curl") or (name == "pip" and arguments[:1] in (["download"], ["wheel"])):
            self.downloads = True
        if name == "tar" and _tar_extracts(arguments) and not any(
                word in ("-C", "--directory") or word.startswith(("--directory=", "-C")) for word in arguments):
            self.unknown_places = True
        if name == "unzip" and not any(word == "-d" or word.startswith("-d") for word in arguments):
            self.unknown_places = True
        if name == "git" and arguments[:1] == ["clone"]:
            self.downloads = True
            places = [word for word in arguments[1:] if not word.startswith("-")]
            if len(places) >= 2:
                self._wrote(places[-1])
        options = WRITING_OPTIONS.get(name, set())
        plain = []
        index = 0
        while index < len(arguments):
            word = arguments[index]
            index += 1
            if word.startswith("-") and word != "-":
                option, equals, value = word.partition("=")
                if option in options and equals:
                    self._wrote(value)
                elif word in options and index < len(arguments):
                    self._wrote(arguments[index])
                    index += 1
                elif not word.startswith("--") and len(word) > 2 and word[:2] in options:  # -Ofile
                    self._wrote(word[2:])
                continue
            plain.append(word)
        if name in ALL_ARGUMENTS:
            for word in plain:
                self._wrote(word)
        elif name in LAST_ARGUMENT and len(plain) >= 2:
            self._wrote(plain[-1])

    def _wrote(self, word: str) -> None:
        path = as_glob(word)
        # A place whose first component the shell decides ($WORKDIR, ${DEST}/x: read as *) could be anywhere; as
        # a glob it would match every path and switch the check off, so it is not counted as written.
        if path is not None and not re.search(r"[*?\[]", path.split("/")[0]) and path not in self.written:
            self.written.append(path)

    def made(self, path: str) -> bool:
        """Whether ``path`` (a glob of as_glob's) is one the steps write, or lies under one, or names one (a glob
        that matches a place written). Matched component by component: a * never stands for a /."""
        parts = path.split("/")
        return any(_leads(place.split("/"), parts) or _leads(parts, place.split("/")) for place in self.written)


def _tar_extracts(arguments: list[str]) -> bool:
    """Whether tar's arguments extract: -x, --extract, --get, or x in the first word's bundled letters (xzf, -xzf)."""
    if any(word in ("--extract", "--get") for word in arguments):
        return True
    if arguments and not arguments[0].startswith("--") and "x" in arguments[0].lstrip("-"):
        return True
    return any(re.fullmatch(r"-[A-Za-z]*x[A-Za-z]*", word) for word in arguments)


def _leads(patterns: list[str], parts: list[str]) -> bool:
    """Whether the path ``parts`` starts with components matched, one each, by the globs ``patterns``."""
    return len(parts) >= len(patterns) and all(part == pattern or fnmatch.fnmatchcase(part, pattern)
                                               for pattern, part in zip(patterns, parts, strict=False))


def _commands(words: list[str]) -> list[list[str]]:
    """The simple commands of a line's words: split at ; && || | & and parentheses."""
    commands: list[list[str]] = [[]]
    for word in words:
        if word in OPERATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]

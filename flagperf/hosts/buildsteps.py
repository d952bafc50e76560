"""What a vendor's image build does, read (never run) for vendor check: a Dockerfile's instructions as Docker joins
them (continuation lines, heredoc bodies, comment lines dropped), and the shell words of a RUN step or an install
script, with the paths those steps write (so a packages/ file the build downloads is not said to be missing) and
whether they download anything. Read loosely on purpose: what cannot be parsed makes the check say less, never
more."""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import PurePosixPath
from typing import NamedTuple

# <<EOF, <<-EOF, <<"EOF", <<'EOF': Docker's (BuildKit) heredocs, whose body lines follow the instruction: a word of
# its own (BuildKit splits the line at blanks), the end word right after the << (`<< EOF` is none of BuildKit's).
HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
# The shell's: wherever << is an operator (cat<<EOF, << EOF, <<\EOF).
SHELL_HEREDOC = re.compile(r"<<(-?)[ \t]*([\"']?)\\?([A-Za-z_][A-Za-z0-9_]*)\2")
# A shell variable in a path: $NAME or ${NAME}; anything more ($(...), ${NAME:-x}) makes the path unknowable here.
VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ";;", "|&"}
PIPES = {"|", "|&"}  # each command of a pipeline runs in a subshell of its own
LISTS = {";", ";;", "&"}  # what ends an and-or list (& runs the whole list in a subshell)
REDIRECTS = {">", ">>", ">|", "&>", "&>>", ">&"}
INPUTS = {"<", "<<", "<<<", "<&", "<>"}
# What shlex reads as one word of punctuation (");", ")|", "&&("), split into the shell's operators, longest first.
PUNCTUATION = re.compile("|".join(re.escape(token) for token in sorted(
    OPERATORS | REDIRECTS | INPUTS, key=len, reverse=True)))
# Shell words before a command (if cd x; then ./y.sh; fi), and NAME=value assignments for it alone.
KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "!", "{"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
# Commands that run the command after their own options (sudo -E pip ..., env -u X make ...): the letters and long
# options of theirs that take a value (sudo -u USER), and the option that runs it in another folder (sudo -D DIR,
# env -C DIR: its relative paths are then unknown here).
WRAPPERS = {
    "sudo": ("ugCDhpRrtTU", {"--user", "--group", "--chdir", "--close-from", "--host", "--prompt", "--role", "--type",
                             "--command-timeout", "--other-user", "--chroot"}, "D"),
    "env": ("uCS", {"--unset", "--chdir", "--split-string"}, "C"),
    "exec": ("a", set(), ""),
    "nice": ("n", {"--adjustment"}, ""),
    "nohup": ("", set(), ""),
    "time": ("", set(), ""),
}
# The options whose value is a path the command writes, per command (the value may be attached: -Ox, --dest=x).
WRITING_OPTIONS = {
    "wget": {"-O", "-P", "--output-document", "--directory-prefix"},
    "curl": {"-o", "--output", "--output-dir"},
    "pip": {"-d", "--dest", "-w", "--wheel-dir"},
    "tar": {"-C", "--directory"},
    "unzip": {"-d"},
    "cp": {"-t", "--target-directory"},
    "mv": {"-t", "--target-directory"},
    "install": {"-t", "--target-directory"},
}
TARGET_OPTIONS = {"-t", "--target-directory"}  # with one, every other argument is a source
# The options whose value is no path the command writes (install -m 755 ...), per command: short letters, long names.
VALUE_OPTIONS = {
    "install": ("mogS", {"--mode", "--owner", "--group", "--suffix", "--strip-program"}),
    "mkdir": ("m", {"--mode", "--context"}),
}
ALL_ARGUMENTS = {"mkdir", "touch", "tee"}  # every argument is written
LAST_ARGUMENT = {"cp", "mv", "ln", "rsync", "install"}  # the destination
# shlex takes time quadratic in a word's length (a 1.6 MB word: minutes) and a script may be 16 MiB: a logical line
# longer than this is split at blanks instead (what it names is still looked for, quotes left on).
SHLEX_LIMIT = 8192
PACKAGES = "packages"  # FlagPerf's folder beside the Dockerfile (vendor check's PACKAGES_FOLDER)
# A path of packages/ in a word as written (packages/x.run, ./packages/wheels/, --find-links=packages/w): not one
# under another folder ($PKGS/packages/x, /opt/packages/y), which is not the build context's.
PACKAGE_PATH = re.compile(rf"(?<![\w./$-])(?:\./)?({PACKAGES}/[^\s'\";|&<>()`]*)")
# What a word names as a file where the shell is in another folder (cd packages && sh x.run): the program by a path
# (./x.sh), a shell's script, an input redirection's file, or an argument by these endings (a wheel, an installer, an
# archive, a script).
FILE_ENDING = re.compile(r"\.(?:whl|run|sh|bash|py|deb|rpm|tar|tgz|tbz2?|txz|gz|bz2|xz|zst|zip)$", re.IGNORECASE)
# Commands whose arguments are text, patterns or names rather than files the shell looks for where it is: after a
# cd, a word of theirs that looks like a file (echo "installing a.run", sed 's/a/b/' setup.py, git checkout
# origin/main) is not read as one.
TEXT_ARGUMENTS = {"echo", "printf", "sed", "grep", "egrep", "fgrep", "awk", "gawk", "git", "test", "[", "[[", "rm",
                  "rmdir"}
# Of those, the ones that need no file: a packages/ path among their arguments is none the build needs (echo "put
# packages/x.run here", rm -f packages/old.run); a test's operand is what a guard looks for (FILE_TESTS).
NO_FILES = {"echo", "printf", "test", "[", "[[", "rm", "rmdir"}
TESTS = {"test", "[", "[["}
# test's and [ 's unary tests of a file: [ -f x.run ] && sh x.run runs x.run only where it is there.
FILE_TESTS = {f"-{letter}" for letter in "abcdefghkprsuwxGLNOS"}
# A local archive ADD unpacks (Docker's ADD extracts tar, gzip, bzip2 and xz archives).
ARCHIVE = re.compile(r"\.(?:tar|tgz|tbz2?|txz|tar\.(?:gz|bz2|xz|zst))$", re.IGNORECASE)


@dataclass(frozen=True)
class Instruction:
    line: int  # where it starts
    keyword: str  # upper case: Docker reads RUN and run alike
    text: str  # its arguments, continuation lines joined; each heredoc's body after a newline
    bodies: tuple[str, ...] = ()  # each heredoc's body alone, in the order the first line opens them


# Docker's parser directives: `# name=value` lines at the very top, before any other line (an empty one or another
# comment ends them, as does a name Docker does not know); escape= sets the line-continuation character.
DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*?)\s*")
KNOWN_DIRECTIVES = {"syntax", "escape", "check"}


def escape_character(lines: list[str]) -> str:
    """The Dockerfile's escape character: a backslash, or what its `# escape=` directive sets (` on Windows)."""
    escape = "\\"
    for line in lines:
        directive = DIRECTIVE.fullmatch(line.strip())
        if directive is None or directive.group(1).lower() not in KNOWN_DIRECTIVES:
            break
        if directive.group(1).lower() == "escape" and directive.group(2) in ("\\", "`"):
            escape = directive.group(2)
    return escape


def heredocs(line: str, *, shell: bool = False) -> list[re.Match[str]]:
    """The heredocs a line opens, in order: a << outside quotes, outside $(( )) (1<<N shifts), not <<< (a here
    string). As Docker's (BuildKit's) parser finds them, the << starts a word (2<<EOF: after its descriptor); as the
    shell does (``shell``), anywhere (cat<<EOF, << EOF). A Dockerfile's exec form (a JSON list) has none."""
    if not shell and line.lstrip().startswith("["):
        try:
            words = json.loads(line)
        except ValueError:
            words = None
        if isinstance(words, list):
            return []
    pattern = SHELL_HEREDOC if shell else HEREDOC
    found: list[re.Match[str]] = []
    quote, arithmetic, position = "", 0, 0
    while position < len(line):
        char = line[position]
        if char == "\\" and quote != "'":
            position += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"" and not arithmetic:
            quote = char
        elif line.startswith("$((", position):
            arithmetic += 1
            position += 3
            continue
        elif arithmetic and char == "(":
            arithmetic += 1
        elif arithmetic and char == ")":
            arithmetic -= 1 if line.startswith("))", position) else 0
            position += 2 if line.startswith("))", position) else 1
            continue
        elif not arithmetic and line.startswith("<<", position) and not line.startswith("<<<", position) \
                and (position == 0 or line[position - 1] != "<"):
            start = len(line[:position].rstrip("0123456789"))
            if shell or start == 0 or line[start - 1].isspace():
                match = pattern.match(line, position)
                if match is not None:
                    found.append(match)
                    position = match.end()
                    continue
            position += 2
            continue
        position += 1
    return found


def dockerfile_instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions as Docker reads them: a line ending in the escape character (a backslash, or
    what `# escape=` sets) goes on with the next (comment and empty lines inside are dropped), a line starting with #
    is a comment, and each heredoc's body (up to its end word) belongs to the instruction that opened it."""
    lines = text.removeprefix("\ufeff").splitlines()  # a BOM (some Windows editors write one) is not text
    escape = escape_character(lines)
    found: list[Instruction] = []
    index = 0
    while index < len(lines):
        start, parts = index + 1, [lines[index]]
        index += 1
        if not parts[0].strip() or parts[0].lstrip().startswith("#"):
            continue
        while parts[-1].rstrip().endswith(escape) and index < len(lines):
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
        for match in heredocs(RUN_FLAGS.sub("", rest)) if keyword.upper() in ("RUN", "COPY", "ADD") else ():
            body = []
            while index < len(lines):
                line = lines[index]
                index += 1
                if (line.lstrip("\t") if match.group(1) else line) == match.group(3):
                    break
                body.append(line)
            bodies.append("\n".join(body))
        found.append(Instruction(start, keyword.upper(), "\n".join([rest.strip(), *bodies]), tuple(bodies)))
    return found


# RUN's own flags before its command: --mount=..., --network=host, --security=insecure.
RUN_FLAGS = re.compile(r"\A(?:--[A-Za-z][A-Za-z0-9-]*(?:=\S*)?\s+)+")
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh"}
HEREDOC_MARK = "__flagperf_heredoc_{}__"  # a heredoc's place in its line, while the line's commands are read


def run_scripts(instruction: Instruction) -> list[str]:
    """The shell scripts a RUN instruction runs, each in a shell of its own: its command line (its flags, such as
    --mount=..., dropped; the exec form, a JSON list of words, as one line of those words quoted, or, where it is a
    shell's -c, that script), and each heredoc body a shell reads as its script. As BuildKit runs it: RUN <<EOF alone
    runs the body; any other line goes to the shell with its heredocs, and a heredoc fed to a shell (bash -e <<EOF)
    is a script, one fed to another command (cat <<EOF > /etc/pip.conf) data: its lines are no commands, nor paths
    the build names."""
    first = RUN_FLAGS.sub("", instruction.text.partition("\n")[0])
    opened = heredocs(first)
    if opened:
        if len(opened) == 1 and first.strip() == opened[0].group(0):
            return list(instruction.bodies[:1])
        return [first] + [instruction.bodies[index] for index in _heredoc_scripts(first, opened)
                          if index < len(instruction.bodies)]
    if not first.startswith("["):
        return [RUN_FLAGS.sub("", instruction.text)]
    try:
        words = json.loads(first)
    except ValueError:
        return [first]
    if not isinstance(words, list) or not words or not all(isinstance(word, str) for word in words):
        return [first]
    if (len(words) >= 3 and PurePosixPath(words[0]).name in SHELLS
            and re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", words[1])):
        return [words[2]]
    return [shlex.join(words)]


def _heredoc_scripts(line: str, heredocs: list[re.Match[str]]) -> list[int]:
    """Which of a line's heredocs (by their order in it) a shell reads as its script: the last one fed to a
    command that is a shell reading its input (bash, sudo -E bash -e, bash -o pipefail, bash --norc), or to cat
    whose output a pipe hands such a shell (cat <<EOF | bash): the shell's input is its last heredoc."""
    marked = line
    for index, heredoc in reversed(list(enumerate(heredocs))):
        marked = f"{marked[:heredoc.start()]} {HEREDOC_MARK.format(index)} {marked[heredoc.end():]}"
    scripts = []
    commands = _commands(shell_words(marked))
    for position, (command, operator) in enumerate(commands):
        fed = [index for index in range(len(heredocs)) if HEREDOC_MARK.format(index) in command]
        words = [word for word in _without_redirections(command) if not re.fullmatch(
            HEREDOC_MARK.format(r"\d+"), word)]
        program, _ = _program(words)
        if not fed or not program:
            continue
        if _reads_its_input(program):
            scripts.append(fed[-1])
        elif PurePosixPath(program[0]).name == "cat" and all(word == "-" for word in program[1:]) \
                and operator in PIPES and position + 1 < len(commands):
            shell, _ = _program(_without_redirections(commands[position + 1][0]))
            if _reads_its_input(shell):
                scripts.append(fed[-1])
    return scripts


def _reads_its_input(program: list[str]) -> bool:
    """Whether a command is a shell that reads its script from its input: its options only (an option that takes a
    value with it: -o pipefail, +O extglob, --rcfile FILE), or -s, none of them -c (a command string) or a script
    file."""
    return _shell_script(program)[0] == "input"


def shell_lines(text: str) -> list[tuple[int, str]]:
    """A script's logical lines (a backslash at the end goes on with the next), each with its first line's number;
    a heredoc's body (up to its end word) is no line of it where it is data (cat > /etc/pip.conf <<EOF), and lines of
    it where a shell reads it as its script (bash <<EOF)."""
    found: list[tuple[int, str]] = []
    lines = text.removeprefix("\ufeff").splitlines()
    # The heredocs whose bodies come next, the first one's first: (its end word, <<- (tabs before it), a script).
    pending: list[tuple[str, bool, bool]] = []
    index = 0
    while index < len(lines):
        start, line = index + 1, lines[index]
        index += 1
        if pending:
            end, dashed, script = pending[0]
            if (line.lstrip("\t") if dashed else line) == end:
                pending.pop(0)
                continue
            if not script:
                continue
        while line.endswith("\\") and index < len(lines):
            line = line[:-1] + " " + lines[index]
            index += 1
        found.append((start, line))
        code = _without_comment(line) if "<<" in line else ""
        opened = heredocs(code, shell=True) if code else []
        if opened:
            scripts = _heredoc_scripts(code, opened)
            pending[:0] = [(heredoc.group(3), bool(heredoc.group(1)), number in scripts)
                           for number, heredoc in enumerate(opened)]
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
        words = list(lexer)
    except ValueError:
        return line.split()
    # shlex gives a run of punctuation as one word: ");" is the end of a subshell and then of a command
    return [part for word in words for part in (
        PUNCTUATION.findall(word) if word and not word.strip("();<>|&") and word not in OPERATORS | REDIRECTS | INPUTS
        else [word])]


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


class Named(NamedTuple):
    """A packages/ path a line names."""

    shown: str  # as the line has it (after a cd: with the path it is from where the shell started)
    path: str  # from where the shell started
    guarded: bool = False  # the line tests it first ([ -f x.run ] && sh x.run): the build goes on without it


def context_path(path: str, places: dict[str, str]) -> str | None:
    """An absolute path of the image as a path of the build context, where a place in ``places`` (an absolute path:
    the context's path it holds) holds it, the nearest first; None where none does."""
    path = posixpath.normpath(path)
    for place in sorted(places, key=len, reverse=True):
        if path == place or path.startswith(place.rstrip("/") + "/"):
            inside = posixpath.normpath(posixpath.join(places[place], posixpath.relpath(path, place)))
            return "" if inside == "." else None if inside == ".." or inside.startswith("../") else inside
    return None


@dataclass
class Shell:
    """Where one shell (a RUN step's, an install script's, a heredoc a shell runs) is, read command by command: its
    folder as a path from where it started ("" there), None where this reading cannot tell (cd to $VAR, to -, popd,
    to an absolute path no COPY or WORKDIR placed). cd and pushd move it; a subshell's ( ... ) or $( ... ), a command
    of a pipeline and an and-or list run in the background (&) move only themselves; a function's body is passed
    over (it runs where it is called, if ever)."""

    folder: str | None = ""
    # The folder and the start of the and-or list at each open parenthesis.
    outer: list[tuple[str | None, str | None]] = field(default_factory=list)
    # The image's absolute paths that hold a part of the build context (COPY . /w/: "/w" holds ""; WORKDIR, where
    # the shell started, holds ""): a cd to one of them is a cd into the context.
    places: dict[str, str] = field(default_factory=dict)
    defining: bool = False  # a function's name and () read: its body follows
    # The packages/ paths a test of this shell looked for ([ -f x.run ], test -f x.run || exit 0): the script goes on
    # without them from there (if [ -f x.run ]; then sh x.run; fi spans lines).
    guards: set[str] = field(default_factory=set)
    body_depth: int = 0  # inside a function's body: the braces open

    def moved(self, arguments: list[str]) -> None:
        """cd's or pushd's arguments."""
        places = [word for word in arguments if not word.startswith("-") or word == "-"]
        place = places[0] if places else ""
        if place.startswith("/") and not re.search(r"[$`~*?\[]", place):
            self.folder = context_path(place, self.places)
            return
        if self.folder is None or not place or place == "-" or place.startswith(("/", "~", "$")) \
                or re.search(r"[`]|\$\(|\$\{[^}]*[^A-Za-z0-9_}]", place):
            self.folder = None
            return
        folder = posixpath.normpath(posixpath.join(self.folder, place))
        self.folder = None if folder == ".." or folder.startswith("../") else "" if folder == "." else folder


@dataclass
class BuildWrites:
    """What the steps read so far write (paths, as globs) and whether any downloads (wget, curl, pip download or
    wheel): a packages/ path not found may then be made by the build itself."""

    written: list[str] = field(default_factory=list)
    downloads: bool = False
    # The image's absolute paths a COPY put a part of the build context in (COPY . /w/: "/w" holds ""; COPY
    # packages /w/packages: "/w/packages" holds "packages"): a cd there, or a path written there, is the context's.
    places: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None  # the WORKDIR the steps read so far set (None: none, or one this cannot tell)
    # Files land where this reading cannot tell (COPY --from, ADD of a URL or an archive, tar x without -C, unzip
    # without -d): a packages/ path not found may be one of them.
    unknown_places: bool = False
    # The folder the command being read runs in (Shell.folder): what it writes by a relative path lies there.
    _folder: str | None = field(default="", init=False, repr=False)
    # Written paths, for lookups without a scan of them all: each one without a glob, every leading part of one, and
    # the globs by their first component.
    _exact: set[str] = field(default_factory=set, init=False, repr=False)
    _leading: set[str] = field(default_factory=set, init=False, repr=False)
    _globs: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
    _by_first: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    def shell(self) -> Shell:
        """A new shell of a RUN step read now: it starts in WORKDIR, and knows where COPY put the context."""
        return Shell(places={**self.places, **({self.workdir: ""} if self.workdir else {})})

    def read(self, words: Iterable[str], shell: Shell | None = None) -> list[Named]:
        """One logical line's words, run in ``shell`` (a new one: in the folder the shell starts in): what it
        writes, and each packages/ path it names, as written and as the path from where the shell started (the
        same, but after a cd: cd packages && sh x.run names packages/x.run), and whether the line tests for it."""
        shell = Shell() if shell is None else shell
        named: list[Named] = []
        command: list[str] = []
        items = [*words, ";"]
        previous, start = ";", shell.folder  # the operator before the command, the folder its and-or list began in
        index = 0
        while index < len(items):
            word = items[index]
            index += 1
            if shell.body_depth:  # a function's body: it runs where it is called, if ever
                shell.body_depth += (word == "{") - (word == "}")
                continue
            if word == "{" and (shell.defining or command[:1] == ["function"]):
                shell.defining, shell.body_depth, command = False, 1, []
                continue
            shell.defining = shell.defining and word == ";"  # f() ( ... ): a subshell's body is read as one
            if word == "(" and items[index:index + 1] == [")"] and not (command and command[-1].endswith("=")) and (
                    len(command) == 1 or (len(command) == 2 and command[0] == "function")):  # NAME=(): an array
                shell.defining, command = True, []  # name() { ...; }
                index += 1
                continue
            if word not in OPERATORS:
                command.append(word)
                continue
            if command:
                shell.defining = shell.defining or (len(command) == 2 and command[0] == "function")
                before = shell.folder
                named += self._command(command, shell)
                if previous in PIPES or word in PIPES:
                    shell.folder = before
            command = []
            if word == "&":
                shell.folder = start
            if word == "(":
                shell.outer.append((shell.folder, start))
            elif word == ")" and shell.outer:
                shell.folder, start = shell.outer.pop()
            if word in LISTS or word == "(":
                start = shell.folder
            previous = word
        return [found._replace(guarded=True) if found.path in shell.guards else found for found in named]

    def copy(self, instruction: Instruction) -> None:
        """A COPY or ADD step: its destination is written. A relative one is under WORKDIR, which the RUN steps
        are in as well; of an absolute one, the part from a packages component on is what a RUN step in WORKDIR
        may name (COPY x /workspace/packages with WORKDIR /workspace), read leniently."""
        parts = copy_parts(instruction)
        if parts is None:
            return
        flags, sources, destination = parts
        self._placed(flags, sources, destination)
        if any(flag.startswith("--from") for flag in flags):
            self.unknown_places = True
        elif instruction.keyword == "ADD" and any(re.match(r"[A-Za-z][A-Za-z0-9+.-]*://|git@", source)
                                                  or ARCHIVE.search(source) for source in sources):
            self.unknown_places = True  # ADD fetches a URL and unpacks a local tar archive
        elif all((as_glob(source) or "").split("/")[0] == PACKAGES for source in sources):
            # packages/ copied from the context: what the destination holds is what the check looks for there
            return
        if destination.startswith("<<"):
            return
        parts = destination.split("/")
        if destination.startswith("/"):
            if PACKAGES not in parts:
                return
            parts = parts[parts.index(PACKAGES):]
        self._folder = ""
        self._wrote("/".join(parts))

    def work(self, instruction: Instruction) -> None:
        """A WORKDIR step: where the RUN steps after it start (a relative one from the WORKDIR before it)."""
        place = instruction.text.partition("\n")[0].strip()
        if not place or re.search(r"[$`]", place) or (not place.startswith("/") and self.workdir is None):
            self.workdir = None  # from a variable, or from the base image's WORKDIR: unknown here
            return
        self.workdir = posixpath.normpath(posixpath.join(self.workdir or "/", place))

    def _placed(self, flags: list[str], sources: list[str], destination: str) -> None:
        """Where a COPY or ADD of one folder of the context (., packages, packages/sub) put it: its contents go to
        the destination."""
        if any(flag.startswith("--from") for flag in flags) or len(sources) != 1 or re.search(r"[$`*?\[]", destination):
            return
        source = posixpath.normpath(sources[0])
        if source != "." and (source.split("/")[0] != PACKAGES or re.search(r"[$`*?\[]", source)
                              or FILE_ENDING.search(source)):
            return  # a file, or a folder the packages/ check has nothing of
        if not destination.startswith("/"):
            if self.workdir is None:
                return
            destination = posixpath.join(self.workdir, destination)
        self.places[posixpath.normpath(destination)] = "" if source == "." else source

    def _command(self, words: list[str], shell: Shell) -> list[Named]:
        targets: list[str] = []  # of > and >>: written once the command's folder is known (env -C moves it)
        program, elsewhere = _program(_without_redirections(words, targets.append))
        self._folder = None if elsewhere else shell.folder
        for target in targets:
            self._wrote(target)
        named = self._named(words, program)
        if not program:
            return named
        name = PurePosixPath(program[0]).name
        arguments = program[1:]
        if name in TESTS:
            shell.guards.update(path for option, operand in pairwise(arguments)
                          if option in FILE_TESTS for path in self._paths(operand))
        if name in ("cd", "pushd"):
            shell.moved(arguments)
            return named
        if name == "popd":
            shell.folder = None
            return named
        if re.fullmatch(r"python[0-9.]*", name) and arguments[:2] == ["-m", "pip"]:
            name, arguments = "pip", arguments[2:]
        name = "pip" if re.fullmatch(r"pip[0-9.]*", name) else name
        if name in ("wget", "curl") or (name == "pip" and arguments[:1] in (["download"], ["wheel"])):
            self.downloads = True
        if name == "tar" and _tar_extracts(arguments) and not any(
                word in ("-C", "--directory") or word.startswith(("--directory=", "-C")) for word in arguments):
            self.unknown_places = True
        if name == "tar" and _tar_creates(arguments):
            archive = _tar_archive(arguments)
            if archive is not None:
                self._wrote(archive)  # tar czf logs.tgz ...: the archive is written, no file needed
        if name == "zip":
            archive = next((word for word in arguments if not word.startswith("-")), None)
            if archive is not None:
                self._wrote(archive)  # zip out.zip files...: its first argument is the archive it writes
        if name == "unzip" and not any(word == "-d" or word.startswith("-d") for word in arguments):
            self.unknown_places = True
        if name == "git" and arguments[:1] == ["clone"]:
            self.downloads = True
            places = [word for word in arguments[1:] if not word.startswith("-")]
            if len(places) >= 2:
                self._wrote(places[-1])
        options = WRITING_OPTIONS.get(name, set())
        letters, valued = VALUE_OPTIONS.get(name, ("", set()))
        plain: list[str] = []
        targeted = directories = False
        index = 0
        while index < len(arguments):
            word = arguments[index]
            index += 1
            if not word.startswith("-") or word == "-":
                plain.append(word)
                continue
            option, equals, value = word.partition("=")
            targeted = targeted or option in TARGET_OPTIONS or word[:2] in TARGET_OPTIONS
            directories = directories or option == "--directory"
            if option in options and equals:
                self._wrote(value)
            elif word in options and index < len(arguments):
                self._wrote(arguments[index])
                index += 1
            elif word in valued and index < len(arguments):
                index += 1  # install --mode 755: the value is no path
            elif not word.startswith("--"):
                # a cluster of short options (-dm755, -Ofile): the first that takes a value takes the rest of the
                # word, or the next word where the rest is empty
                for position, letter in enumerate(word[1:], 1):
                    directories = directories or (name == "install" and letter == "d")
                    if f"-{letter}" in options or letter in letters:
                        value = word[position + 1:]
                        if not value and index < len(arguments):
                            value = arguments[index]
                            index += 1
                        if f"-{letter}" in options and value:
                            self._wrote(value)
                        break
        if name in ALL_ARGUMENTS or (name == "install" and directories):  # install -d makes folders
            for word in plain:
                self._wrote(word)
        elif name in LAST_ARGUMENT and len(plain) >= 2 and not targeted:
            self._wrote(plain[-1])
        return named

    def _named(self, words: list[str], program: list[str]) -> list[Named]:
        """The packages/ paths a command's words name: as written where the shell is where it started (but none of
        echo's, printf's or a test's); after a cd, from the folder it is in, the words that name a file there: the
        program by a path (./x.sh), a shell's script (sh x.run, . ./env.sh), an input redirection's file, or an
        argument by a file's ending with no blank in it (pip install wheels/*.whl), but none of a command whose
        arguments are text or patterns (echo, sed, git, test: TEXT_ARGUMENTS)."""
        name = PurePosixPath(program[0]).name if program else ""
        if self._folder == "":
            if name in NO_FILES:
                return []
            return [Named(found, found) for word in words for found in PACKAGE_PATH.findall(word)]
        if self._folder is None:
            return []
        candidates = []
        if program:
            if "/" in program[0]:
                candidates.append(program[0])  # ./x.sh; a bare name is a command found on PATH
            script = _script_argument(program)
            if script is not None:
                candidates.append(program[script])
            elif name not in TEXT_ARGUMENTS | SHELLS:  # a shell with no script file: its words are its arguments
                candidates += [word for word in program[1:] if not word.startswith("-") and FILE_ENDING.search(word)]
        candidates += [after for before, after in pairwise(words) if before in ("<", "<>")]
        found = []
        for word in dict.fromkeys(candidates):
            if re.search(r"\s", word) or word.startswith(("-", "/", "~", "$")) or "://" in word or "=" in word:
                continue
            path = posixpath.normpath(posixpath.join(self._folder, word))
            if path.startswith(PACKAGES + "/"):
                found.append(Named(f"{word} ({path} after cd {self._folder})", path))
        return found

    def _paths(self, word: str) -> list[str]:
        """The packages/ paths one word names, from where the shell started (a test's operand)."""
        if self._folder == "":
            return PACKAGE_PATH.findall(word)
        if self._folder is None or word.startswith(("/", "~", "$")):
            return []
        path = posixpath.normpath(posixpath.join(self._folder, word))
        return [path] if path.startswith(PACKAGES + "/") else []

    def _wrote(self, word: str) -> None:
        path = as_glob(word)
        if path is None or (self._folder is None and not path.startswith("/")):
            return  # relative to a folder this reading cannot tell
        if self._folder and not path.startswith("/"):
            path = posixpath.normpath(posixpath.join(self._folder, path))
            if path == ".." or path.startswith("../"):
                return
        if path.startswith("/") and not re.search(r"[*?\[]", path):
            inside = context_path(path, self.places)  # where COPY put the context: the context's path too
            if inside:
                self._add(inside)
        self._add(path)

    def _add(self, path: str) -> None:
        # A place whose first component the shell decides ($WORKDIR, ${DEST}/x: read as *) could be anywhere; as
        # a glob it would match every path and switch the check off, so it is not counted as written.
        first = path.split("/")[0]
        if re.search(r"[*?\[]", first) or path in self._exact or path in self._globs.get(first, ()):
            return
        self.written.append(path)
        self._by_first.setdefault(first, []).append(path)
        if re.search(r"[*?\[]", path):
            self._globs.setdefault(first, []).append(path)
            return
        self._exact.add(path)
        parts = path.split("/")
        self._leading.update("/".join(parts[:end]) for end in range(1, len(parts) + 1))

    def made(self, path: str) -> bool:
        """Whether ``path`` (a glob of as_glob's) is one the steps write, or lies under one, or names one (a glob
        that matches a place written). Matched component by component: a * never stands for a /. Looked up, not
        scanned: only a glob is matched against the written places of its first component."""
        parts = path.split("/")
        if not re.search(r"[*?\[]", path):
            if path in self._leading or any("/".join(parts[:end]) in self._exact for end in range(1, len(parts))):
                return True
            places = self._globs.get(parts[0], [])
        else:
            places = self.written if re.search(r"[*?\[]", parts[0]) else self._by_first.get(parts[0], [])
        return any(_leads(place.split("/"), parts) or _leads(parts, place.split("/")) for place in places)


def _without_redirections(words: list[str], targets: Callable[[str], None] | None = None) -> list[str]:
    """A simple command's words without its redirections (> file, < file, << word), each target of > or >> given
    to ``targets``."""
    rest: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word.isdigit() and index + 1 < len(words) and words[index + 1] in REDIRECTS | INPUTS:
            index += 1  # 2>&1, 2> err.log: the number is the redirected descriptor, no argument
            continue
        if word in REDIRECTS and index + 1 < len(words):
            if targets is not None and not words[index + 1].isdigit():  # >&2 is no file
                targets(words[index + 1])
            index += 2
            continue
        if word in INPUTS:
            index += 2
            continue
        rest.append(word)
        index += 1
    return rest


def _program(words: list[str]) -> tuple[list[str], bool]:
    """A simple command's words from the program it runs on: without the shell's keywords (if, then, !), NAME=value
    assignments, and the commands that run it (sudo -E, env -u X, nohup, exec) with their options; and whether one
    of those runs it in another folder (sudo -D DIR, env -C DIR), whose relative paths are then unknown here. env -S
    (its command in one string) leaves nothing known."""
    elsewhere = False
    index = 0
    while index < len(words):
        word = words[index]
        if word in KEYWORDS or ASSIGNMENT.fullmatch(word):
            index += 1
            continue
        runner = PurePosixPath(word).name
        wrapper = WRAPPERS.get(runner)
        if wrapper is None:
            break
        letters, valued, folder = wrapper
        index += 1
        while index < len(words) and words[index].startswith("-") and words[index] != "-":
            option = words[index]
            index += 1
            if option == "--":
                break
            if option.startswith("--"):
                name, equals, _ = option.partition("=")
                elsewhere = elsewhere or name == "--chdir"
                if name == "--split-string":
                    return [], elsewhere
                if name in valued and not equals:
                    index += 1
                continue
            for position, letter in enumerate(option[1:], 1):
                if letter in letters:
                    elsewhere = elsewhere or letter == folder
                    if letter == "S" and runner == "env":
                        return [], elsewhere
                    if not option[position + 1:]:
                        index += 1
                    break
        if index < len(words) and words[index] == "-" and runner == "env":  # env - : an empty environment
            index += 1
    return words[index:], elsewhere


def _script_argument(program: list[str]) -> int | None:
    """Where a shell's script file is among a command's words (sh x.run, bash -e x.sh, bash -o pipefail x.sh, .
    x.sh), None where there is none (sh -c '...': a command string; bash -s, or no script: it reads its input)."""
    if program and PurePosixPath(program[0]).name in ("source", "."):
        return 1 if len(program) > 1 else None
    how, position = _shell_script(program)
    return position if how == "file" else None


def _shell_script(program: list[str]) -> tuple[str, int]:
    """What script a command that is a shell runs: ("file", where its name is among the words), ("command", 0) for
    -c, ("input", 0) where it reads its input (-s, -, or no script named), ("", 0) where it is no shell. A shell's
    options are walked as it reads them: -o, +O, --rcfile and --init-file take a value (-o pipefail, -eo pipefail);
    -- ends them."""
    if not program or PurePosixPath(program[0]).name not in SHELLS:
        return "", 0
    index = 1
    while index < len(program):
        word = program[index]
        index += 1
        if word == "-":
            return "input", 0
        if word == "--":
            break
        if word in ("--rcfile", "--init-file"):
            index += 1
        elif word.startswith("--"):
            continue  # --norc, --login, --posix
        elif re.fullmatch(r"[-+][A-Za-z]+", word):
            if word[0] == "-" and "c" in word[1:]:
                return "command", 0
            if word[0] == "-" and "s" in word[1:]:
                return "input", 0
            index += sum(letter in "oO" for letter in word[1:])
        else:
            return "file", index - 1
    return ("file", index) if index < len(program) else ("input", 0)


def run_by_pattern(script: str) -> list[str]:
    """The programs and shell scripts a script runs by a name the shell decides ($SCRIPT, ./${FW}_install.sh, a for
    loop's $s over *_install.sh), each as a glob of what it may be (as_glob's: a variable is *)."""
    found = []
    for _, line in shell_lines(script):
        for command, _ in _commands(shell_words(line)):
            program, _ = _program(_without_redirections(command))
            position = _script_argument(program)
            for word in program[:1] + ([program[position]] if position is not None else []):
                glob = as_glob(word)
                if glob is not None and re.search(r"[*?\[]", glob):
                    found.append(glob)
    return found


def _tar_extracts(arguments: list[str]) -> bool:
    """Whether tar's arguments extract: -x, --extract, --get, or x in the first word's bundled letters (xzf, -xzf)."""
    if any(word in ("--extract", "--get") for word in arguments):
        return True
    if arguments and not arguments[0].startswith("--") and "x" in arguments[0].lstrip("-"):
        return True
    return any(re.fullmatch(r"-[A-Za-z]*x[A-Za-z]*", word) for word in arguments)


def _tar_creates(arguments: list[str]) -> bool:
    """Whether tar's arguments write an archive: -c, -r, -u (create, append, update), their long names, or one of
    those letters in the first word's bundle (czf, -cf)."""
    if any(word in ("--create", "--append", "--update") for word in arguments):
        return True
    if arguments and not arguments[0].startswith("--") and re.search("[cru]", arguments[0].lstrip("-")):
        return True
    return any(re.fullmatch(r"-[A-Za-z]*[cru][A-Za-z]*", word) for word in arguments)


def _tar_archive(arguments: list[str]) -> str | None:
    """The archive tar's arguments name: --file=x, --file x, -f x, -fx, or f in the first word's bundle of letters,
    whose value is the next word (czf x.tgz: each bundled letter that takes a value takes the next word in turn)."""
    for index, word in enumerate(arguments):
        if word.startswith("--file="):
            return word.partition("=")[2]
        if word == "--file":
            return arguments[index + 1] if index + 1 < len(arguments) else None
        bundled = (index == 0 and not word.startswith("-")) or re.fullmatch(r"-[A-Za-z]+", word)
        if bundled and "f" in word:
            letters = word.lstrip("-")
            attached = letters[letters.index("f") + 1:]
            if word.startswith("-") and attached:
                return attached  # -fx.tar
            # the bundled letters before f that take a value (-C DIR, -T FILE, -b N) take the words before its
            taken = sum(letter in "CTXbKLNVg" for letter in letters[:letters.index("f")])
            value = index + 1 + taken
            return arguments[value] if value < len(arguments) else None
    return None


def _leads(patterns: list[str], parts: list[str]) -> bool:
    """Whether the path ``parts`` starts with components matched, one each, by the globs ``patterns``."""
    return len(parts) >= len(patterns) and all(part == pattern or fnmatch.fnmatchcase(part, pattern)
                                               for pattern, part in zip(patterns, parts, strict=False))


def _commands(words: list[str]) -> list[tuple[list[str], str]]:
    """The simple commands of a line's words, each with the operator after it (";" at the end): split at ; && || |
    & and parentheses."""
    commands: list[tuple[list[str], str]] = [([], ";")]
    for word in words:
        if word in OPERATORS:
            commands[-1] = (commands[-1][0], word)
            commands.append(([], ";"))
        else:
            commands[-1][0].append(word)
    return [(command, operator) for command, operator in commands if command]

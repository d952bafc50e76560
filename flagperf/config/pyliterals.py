"""FlagPerf's Python configuration files (test_conf.py, cluster_conf.py, config_<hw>x<n>x<p>.py), read without
running them.

FlagPerf imports these files; here they are parsed with ``ast`` and only top-level ``NAME = value`` statements
are taken, where ``value`` is a literal (numbers, strings, True/False/None, lists, tuples, dicts, sets of
literals, a negative number), an earlier name of the same file, or ``+`` of those (FlagPerf writes
``FLAGPERF_LOG_PATH = FLAGPERF_PATH + "/result/"`` and concatenated option strings). Docstrings and other bare
string statements are allowed (FlagPerf's files have them between assignments). Anything else (an import, a
call, a loop, a function, an f-string, an attribute) is refused with one line naming the file, its line and
the name or statement: checking a file never executes it.

One import is read where the caller names its module (a vendor's scale files: ``from config_common import *``,
with which FlagPerf's vendor config files begin): ``<module>.py`` from the importing file's own folder, read the
same way (never run, never imported), its public names first and the file's own assignments after them, as
Python would bind them. Only that form, at the top, one level deep.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.files import given_name, is_present, read_config_text, regular_file
from flagperf.config.yamlio import MAX_TEXT
from flagperf.errors import ConfigError
from flagperf.paths import display_path

# Statement kinds as a reader of the error knows them.
_STATEMENTS: dict[type[ast.stmt], str] = {
    ast.For: "a for loop", ast.AsyncFor: "a for loop",
    ast.While: "a while loop", ast.If: "an if statement", ast.With: "a with statement", ast.Try: "a try statement",
    ast.FunctionDef: "a function definition", ast.AsyncFunctionDef: "a function definition",
    ast.ClassDef: "a class definition", ast.AugAssign: "an augmented assignment (+= ...)", ast.Delete: "a del",
    ast.Global: "a global statement", ast.Assert: "an assert", ast.Raise: "a raise",
}


# FlagPerf's files nest a few brackets and join a few strings; far more is no configuration.
MAX_DEPTH = 100
# FlagPerf's largest configuration file is a few KiB; parsing takes seconds per MiB on a small machine.
MAX_PYTHON_BYTES = 256 * 1024
# A value with the earlier names it uses written out, in items and characters: far above any configuration.
MAX_EXPANDED = 1 << 20


class _NotLiteral(Exception):
    """The expression is not a literal, a known name or a + of those; the message says what it is."""


def _describe(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return f"a call to {_shown(node.func)}()"
    if isinstance(node, ast.Name):
        return f"the name {node.id}, which no earlier line of the file assigns"
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.Attribute):
        return f"the attribute {_shown(node)}"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, ast.ListComp | ast.DictComp | ast.SetComp | ast.GeneratorExp):
        return "a comprehension (a loop)"
    if isinstance(node, ast.BinOp):
        return f"the operation {_shown(node)} (only + of literals and earlier names is read)"
    return f"the expression {_shown(node)}"


def _value(node: ast.expr, known: dict[str, Any], sizes: dict[str, int], depth: int = 0) -> tuple[Any, int]:
    """The node's value and its size with every earlier name it uses written out (a string counts its length,
    any other item 1): ``A = A + A`` twice a line, or a list of a list of ... of earlier names, would otherwise
    fill memory from a small file."""
    if depth > MAX_DEPTH:
        raise _NotLiteral(f"brackets or + nested more than {MAX_DEPTH} deep")
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id], sizes[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        (left, left_size), (right, right_size) = (_value(node.left, known, sizes, depth + 1),
                                                  _value(node.right, known, sizes, depth + 1))
        _bounded(left_size + right_size)  # before the sum is made
        try:
            return _short(left + right), left_size + right_size
        except TypeError:
            raise _NotLiteral(f"{_shown(node)} adds values of types {type(left).__name__} and "
                              f"{type(right).__name__}") from None
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        read = [_value(item, known, sizes, depth + 1) for item in node.elts]
        items, size = [item for item, _ in read], _bounded(1 + sum(s for _, s in read))
        if isinstance(node, ast.Set):
            return _hashed(set, items), size
        return (items if isinstance(node, ast.List) else tuple(items)), size
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotLiteral("a ** expansion in a dict")
        keys = [_value(key, known, sizes, depth + 1) for key in node.keys if key is not None]
        values = [_value(value, known, sizes, depth + 1) for value in node.values]
        size = _bounded(1 + sum(s for _, s in keys + values))
        return _hashed(dict, list(zip([k for k, _ in keys], [v for v, _ in values], strict=True))), size
    try:
        value = ast.literal_eval(node)  # constants, -1, 1e3
    except (RecursionError, MemoryError):
        raise _NotLiteral(f"an expression nested more than {MAX_DEPTH} deep") from None
    except (ValueError, TypeError, SyntaxError):
        raise _NotLiteral(_describe(node)) from None
    return _short(value), _bounded(len(value) if isinstance(value, str | bytes) else 1)


def _short(value: Any) -> Any:
    """Text in a configuration is short, as in the YAML files (flagperf.config.yamlio.MAX_TEXT)."""
    if isinstance(value, str | bytes) and len(value) > MAX_TEXT:
        raise _NotLiteral(f"a string of {len(value)} characters; a config value is at most {MAX_TEXT}")
    return value


def _bounded(size: int) -> int:
    if size > MAX_EXPANDED:
        raise _NotLiteral(f"a value of more than {MAX_EXPANDED} items or characters with its names written out")
    return size


def _hashed(kind: type, items: list[Any]) -> Any:
    """set(items) or dict(items), where an unhashable member (a list as a key) is the file's error."""
    try:
        return kind(items)
    except TypeError as exc:
        raise _NotLiteral(f"a set member or dict key that cannot be one ({exc})") from None


def _shown(node: ast.expr) -> str:
    """The expression as written, for an error line (bounded there; deep nesting is refused before this)."""
    try:
        return ast.unparse(node)
    except RecursionError:
        return "(nested too deeply to show)"


def parse_python(text: str, source: str) -> ast.Module:
    """The file's syntax tree, or one ConfigError line: invalid Python, and input the parser cannot take
    (nesting thousands deep raises RecursionError or MemoryError inside ``ast.parse``)."""
    try:
        return ast.parse(text, filename=source)
    except SyntaxError as exc:
        raise ConfigError(f"{source}:{exc.lineno}" if exc.lineno else source, None, f"not valid Python: {exc.msg}"
                          ) from None
    except (RecursionError, MemoryError):
        raise ConfigError(source, None, "nested too deeply to be read as Python (this file is never run)") from None
    except ValueError as exc:  # a NUL byte, on Pythons that do not call it a SyntaxError
        raise ConfigError(source, None, f"not valid Python: {exc}") from None


@dataclass
class LiteralFile:
    """A Python configuration file's assignments, and the line each name was (last) assigned on. With a star
    import read (``common``), ``values`` holds the names it brought in too; ``from_common`` those of them the
    file does not assign itself."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict, repr=False)  # _value's sizes, for names used later
    common: LiteralFile | None = None
    from_common: set[str] = field(default_factory=set)

    def where(self, name: str) -> str:
        """``file:line`` of a name, for an error about its value (the imported file's, for a name from it)."""
        if name in self.from_common and self.common is not None:
            return self.common.where(name)
        return f"{self.source}:{self.lines[name]}" if name in self.lines else self.source

    def exported(self) -> list[str]:
        """What ``from <this file> import *`` binds: ``__all__`` where the file gives it, else every name not
        starting with an underscore."""
        if "__all__" not in self.values:
            return [name for name in self.values if not name.startswith("_")]
        names = self.values["__all__"]
        if not (isinstance(names, list | tuple) and all(isinstance(name, str) for name in names)):
            raise ConfigError(self.where("__all__"), "__all__", "not a list of names")
        missing = [name for name in names if name not in self.values]
        if missing:
            raise ConfigError(self.where("__all__"), "__all__", f"names {', '.join(missing)}, which the file "
                                                                "does not assign")
        return list(dict.fromkeys(names))


def read_literal_assignments(path: Path) -> dict[str, Any]:
    """The top-level ``NAME = literal`` assignments of a Python configuration file, in file order; a later
    assignment of a name replaces the earlier one, as it would when the file ran."""
    return read_literal_file(path).values


def read_literal_file(path: Path, star_import: str | None = None) -> LiteralFile:
    """read_literal_assignments, with the line of every name. ``star_import``: the module whose
    ``from <module> import *`` is read (see the module docstring); any other import is refused."""
    return _read(path, display_path(path), star_import, importer=None)


def _is_star_import(node: ast.stmt, module: str | None) -> bool:
    """``from <module> import *`` exactly (not relative, not a list of names); any module when None."""
    return (isinstance(node, ast.ImportFrom) and node.level == 0 and [a.name for a in node.names] == ["*"]
            and (module is None or node.module == module))


def _read_star_import(path: Path, module: str, where: str, read: LiteralFile) -> None:
    """``from <module> import *`` in ``path``: <module>.py from path's own folder (a link must stay in it),
    read without running it, its exported names bound into ``read``."""
    folder, name = path.parent, f"{module}.py"
    if read.common is not None:
        raise ConfigError(where, None, f"a second from {module} import *: one is read")
    if read.values:  # it would replace them, as it would when the file ran: the file's own values come after it
        raise ConfigError(where, None, f"from {module} import * after assignments ({', '.join(read.values)}), "
                                       "which it would replace: put it first, as FlagPerf's files do")
    if not is_present(folder / name):
        raise ConfigError(where, None, f"from {module} import *: {name} is not in {given_name(folder)} (read from "
                                       f"the folder of {path.name}, never run)")
    target = regular_file(folder, name, where, None, f"the folder of {path.name}")
    common = _read(target, display_path(folder / name), None, importer=path.name)
    for exported in common.exported():
        read.values[exported], read.sizes[exported] = common.values[exported], common.sizes[exported]
        read.from_common.add(exported)
    read.common = common


def _read(path: Path, source: str, star_import: str | None, importer: str | None) -> LiteralFile:
    """The reading itself; ``importer``: the file whose star import this one is (its own are then refused)."""
    text = read_config_text(path)
    if len(text) > MAX_PYTHON_BYTES:
        raise ConfigError(source, None, f"{len(text)} characters; a Python configuration file is at most "
                                        f"{MAX_PYTHON_BYTES}; not read")
    tree = parse_python(text, source)
    read = LiteralFile(source)
    values, sizes = read.values, read.sizes
    for node in tree.body:
        where = f"{source}:{node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring, or a string used as a comment
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            if len(names) != len(targets) or node.value is None:
                raise ConfigError(where, _shown(targets[0]), "only NAME = value is read (this file is "
                                                                  "never run)")
            try:
                value, size = _value(node.value, values, sizes)
            except _NotLiteral as exc:
                raise ConfigError(where, names[0], f"{exc}: only literals, earlier names and + of those are "
                                                   "read (this file is never run)") from None
            for name in names:
                values[name], sizes[name] = value, size
                read.lines[name] = node.lineno
                read.from_common.discard(name)
            continue
        if star_import is not None and _is_star_import(node, star_import):
            _read_star_import(path, star_import, where, read)
            continue
        if importer is not None and _is_star_import(node, None):
            raise ConfigError(where, None, f"a star import inside {Path(source).name} (imported by {importer}): "
                                           "only one level is read; write its values out (this file is never run)")
        if isinstance(node, ast.Expr):
            what = _describe(node.value)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            origin = (f" from {'.' * node.level}{node.module or ''}" if isinstance(node, ast.ImportFrom)
                      and (node.module or node.level) else "")  # the dots: `from .config_common` is not read
            what = f"an import of {', '.join(alias.name for alias in node.names)}{origin}"
        else:
            what = _STATEMENTS.get(type(node), f"a {type(node).__name__} statement")
        raise ConfigError(where, None, f"{what}: only top-level NAME = literal assignments are read (this file "
                                       "is never run)")
    return read

"""FlagPerf's Python configuration files (test_conf.py, cluster_conf.py, config_<hw>x<n>x<p>.py), read without
running them.

FlagPerf imports these files; here they are parsed with ``ast`` and only top-level ``NAME = value`` statements
are taken, where ``value`` is a literal (numbers, strings, True/False/None, lists, tuples, dicts, sets of
literals, a negative number), an earlier name of the same file, or ``+`` of those (FlagPerf writes
``FLAGPERF_LOG_PATH = FLAGPERF_PATH + "/result/"`` and concatenated option strings). Docstrings and other bare
string statements are allowed (FlagPerf's files have them between assignments). Anything else (an import, a
call, a loop, a function, an f-string, an attribute) is refused with one line naming the file, its line and
the name or statement: checking a file never executes it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.files import read_config_text
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


class _NotLiteral(Exception):
    """The expression is not a literal, a known name or a + of those; the message says what it is."""


def _describe(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return f"a call to {ast.unparse(node.func)}()"
    if isinstance(node, ast.Name):
        return f"the name {node.id}, which no earlier line of the file assigns"
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    if isinstance(node, ast.Attribute):
        return f"the attribute {ast.unparse(node)}"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, ast.ListComp | ast.DictComp | ast.SetComp | ast.GeneratorExp):
        return "a comprehension (a loop)"
    if isinstance(node, ast.BinOp):
        return f"the operation {ast.unparse(node)} (only + of literals and earlier names is read)"
    return f"the expression {ast.unparse(node)}"


def _value(node: ast.expr, known: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, known), _value(node.right, known)
        try:
            return left + right
        except TypeError:
            raise _NotLiteral(f"{ast.unparse(node)} adds values of types {type(left).__name__} and "
                              f"{type(right).__name__}") from None
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [_value(item, known) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items) if isinstance(node, ast.Tuple) else set(items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotLiteral("a ** expansion in a dict")
        return {_value(key, known): _value(value, known) for key, value in zip(node.keys, node.values, strict=True)
                if key is not None}
    try:
        return ast.literal_eval(node)  # constants, -1, 1e3
    except ValueError:
        raise _NotLiteral(_describe(node)) from None


@dataclass
class LiteralFile:
    """A Python configuration file's assignments, and the line each name was (last) assigned on."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, name: str) -> str:
        """``file:line`` of a name, for an error about its value."""
        return f"{self.source}:{self.lines[name]}" if name in self.lines else self.source


def read_literal_assignments(path: Path) -> dict[str, Any]:
    """The top-level ``NAME = literal`` assignments of a Python configuration file, in file order; a later
    assignment of a name replaces the earlier one, as it would when the file ran."""
    return read_literal_file(path).values


def read_literal_file(path: Path) -> LiteralFile:
    """read_literal_assignments, with the line of every name."""
    source = display_path(path)
    text = read_config_text(path)
    try:
        tree = ast.parse(text, filename=source)
    except SyntaxError as exc:
        raise ConfigError(f"{source}:{exc.lineno}", None, f"not valid Python: {exc.msg}") from None
    read = LiteralFile(source)
    values = read.values
    for node in tree.body:
        where = f"{source}:{node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring, or a string used as a comment
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            if len(names) != len(targets) or node.value is None:
                raise ConfigError(where, ast.unparse(targets[0]), "only NAME = value is read (this file is "
                                                                  "never run)")
            try:
                value = _value(node.value, values)
            except _NotLiteral as exc:
                raise ConfigError(where, names[0], f"{exc}: only literals, earlier names and + of those are "
                                                   "read (this file is never run)") from None
            for name in names:
                values[name] = value
                read.lines[name] = node.lineno
            continue
        if isinstance(node, ast.Expr):
            what = _describe(node.value)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            origin = f" from {node.module}" if isinstance(node, ast.ImportFrom) and node.module else ""
            what = f"an import of {', '.join(alias.name for alias in node.names)}{origin}"
        else:
            what = _STATEMENTS.get(type(node), f"a {type(node).__name__} statement")
        raise ConfigError(where, None, f"{what}: only top-level NAME = literal assignments are read (this file "
                                       "is never run)")
    return read

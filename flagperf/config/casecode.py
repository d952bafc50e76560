"""A case's code, checked without running it (`flagperf validate`).

`flagperf run` imports a case's module to validate its configuration with the case's own ``Config``. Checking
a file must not execute it, so `flagperf validate` reads the module with ``ast`` instead: it must parse,
define the functions its family calls, and define ``Config`` as a subclass of a config base from the core
(flagperf.measure.casekit.CaseConfig or a family's). ``Config`` is then rebuilt from its class body: each
field's annotation and its ``Field(...)`` or literal default are evaluated where they are made only of
literals and names imported from the core, pydantic or typing; a field that is not (a type of the case's own,
a validator of the case's own) is checked for presence only. Only the core's modules are imported, never the
case's; the case's own validators (``field_validator``, ``model_validator``) run when the case runs.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import operator
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar

import pydantic
from pydantic import BaseModel

from flagperf.config.files import read_config_text
from flagperf.config.models import CaseConfig
from flagperf.errors import CaseUserError, ConfigError, missing_extra
from flagperf.paths import display_path

_CODE_RUNS: ContextVar[bool] = ContextVar("flagperf_case_code_runs", default=True)

# Modules a case's annotations may name and that may be imported to read them: the core and libraries whose
# import runs no case code.
_IMPORTABLE = ("flagperf", "pydantic", "typing", "typing_extensions", "collections", "pathlib", "datetime",
               "decimal", "enum")
_BUILTIN_TYPES = {name: getattr(builtins, name) for name in (
    "int", "float", "str", "bool", "bytes", "list", "dict", "tuple", "set", "frozenset", "object", "type")}
_CALLABLE = {pydantic.Field, pydantic.ConfigDict}  # the only calls the reader makes
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


class CodeNotRun(CaseUserError):
    """Raised where code of a case or a plug-in would be imported while `flagperf validate` checks files: the
    check that needs it is left to the run (a CaseUserError, so that a caller skipping an optional check can
    catch it as it catches a missing library)."""


def code_runs() -> bool:
    return _CODE_RUNS.get()


@contextmanager
def case_code_not_run() -> Iterator[None]:
    """Within: cases' and plug-ins' files are read, never imported (flagperf.config.vendors.import_file refuses)."""
    token = _CODE_RUNS.set(False)
    try:
        yield
    finally:
        _CODE_RUNS.reset(token)


class _Unreadable(Exception):
    """An expression the reader does not evaluate (it would need the case's code, or is not a literal)."""


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module-level statements, also those under if/try/with at module level (not in functions or classes)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        yield node
        if isinstance(node, ast.If | ast.With):
            pending[:0] = [*node.body, *getattr(node, "orelse", [])]
        elif isinstance(node, ast.Try):
            pending[:0] = [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]


class _Module:
    """The names a module defines at its top level, and how to evaluate the harmless ones."""

    def __init__(self, tree: ast.Module, path: Path, family: str) -> None:
        self.path, self.family = path, family
        self.classes: dict[str, ast.ClassDef] = {}
        self.imported: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute or None)
        self.assigned: dict[str, ast.expr | None] = {}
        self.names: set[str] = set()
        for node in _top_level(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                self.names.add(node.name)
                self.classes[node.name] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.asname or alias.name.partition(".")[0]
                    self.names.add(name)
                    self.imported[name] = (alias.name if alias.asname else name, None)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    name = alias.asname or alias.name
                    self.names.add(name)
                    module = "." * node.level + (node.module or "")  # relative: the case's own code
                    self.imported[name] = (module, alias.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                        if isinstance(element, ast.Name):
                            self.names.add(element.id)
                            self.assigned[element.id] = node.value if len(targets) == 1 and element is target \
                                else None
        self._built: dict[str, type[BaseModel]] = {}
        self._depth = 0

    # -- names and values -------------------------------------------------------------------------------------

    def _import(self, module: str) -> Any:
        if module.startswith(".") or module.partition(".")[0] not in _IMPORTABLE:
            raise _Unreadable(module)
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            missing = missing_extra(exc, self.family, display_path(self.path))
            if missing is not None:
                raise missing from None
            raise _Unreadable(module) from None

    def name(self, name: str) -> Any:
        if name in self.imported:
            module, attribute = self.imported[name]
            found = self._import(module)
            if attribute is None:
                return found
            try:
                return getattr(found, attribute)
            except AttributeError:
                try:  # `from flagperf.x import submodule`
                    return self._import(f"{module}.{attribute}")
                except _Unreadable:
                    raise ConfigError(display_path(self.path), name,
                                      f"{module} has no {attribute!r}; the module could not be imported") from None
        if name in self.classes:
            return self.model(name)
        if name in self.assigned and self.assigned[name] is not None:  # a type alias such as Mode = Literal[...]
            if self._depth > 20:
                raise _Unreadable(name)
            self._depth += 1
            try:
                return self.value(self.assigned[name])  # type: ignore[arg-type]
            finally:
                self._depth -= 1
        if name in self.names:
            raise _Unreadable(name)  # defined by the case's own code
        if name in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[name]
        raise _Unreadable(name)

    def value(self, node: ast.expr) -> Any:
        """Literals, names from the core or libraries, X | Y, X[...], and calls of pydantic.Field/ConfigDict."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.value(node.value)
            if not (isinstance(owner, type(pydantic)) and owner.__name__.partition(".")[0] in _IMPORTABLE):
                raise _Unreadable(node.attr)  # attributes of modules only: no property of an object is read
            try:
                return getattr(owner, node.attr)
            except AttributeError:
                return self._import(f"{owner.__name__}.{node.attr}")
        if isinstance(node, ast.Subscript):
            return self.value(node.value)[self.value(node.slice)]
        if isinstance(node, ast.Tuple):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.List):
            return [self.value(e) for e in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.value(node.left) | self.value(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self.value(node.operand)
            if isinstance(operand, int | float) and not isinstance(operand, bool):
                return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:  # Field(ge=MASK_ID + 1), 2**20
            left, right = self.value(node.left), self.value(node.right)
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (left, right)):
                if isinstance(node.op, ast.Pow) and not (abs(left) <= 2 ** 64 and 0 <= right <= 64):
                    raise _Unreadable("a power too large to compute here")
                with suppress(ArithmeticError):
                    return _ARITHMETIC[type(node.op)](left, right)
        if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
            function = self.value(node.func)
            if function in _CALLABLE and all(k.arg is not None for k in node.keywords):
                return function(*(self.value(a) for a in node.args),
                                **{str(k.arg): self.value(k.value) for k in node.keywords})
        raise _Unreadable(ast.dump(node)[:80])

    # -- Config -----------------------------------------------------------------------------------------------

    def model(self, name: str) -> type[BaseModel]:
        if name not in self._built:
            if self._depth > 20:
                raise _Unreadable(name)
            self._depth += 1
            try:
                self._built[name] = self._build(self.classes[name])
            finally:
                self._depth -= 1
        return self._built[name]

    def _build(self, node: ast.ClassDef) -> type[BaseModel]:
        source = display_path(self.path)
        if len(node.bases) != 1 or node.keywords:
            raise ConfigError(source, node.name, "must have one base class, the config base it extends")
        try:
            base = self.value(node.bases[0])
        except _Unreadable:
            raise ConfigError(source, node.name, f"its base {ast.unparse(node.bases[0])} is not a config class of "
                                                 "flagperf (or of this module), so it cannot be checked without "
                                                 "running the case") from None
        if not (isinstance(base, type) and issubclass(base, CaseConfig)):
            raise ConfigError(source, node.name, "must subclass flagperf.measure.casekit.CaseConfig")
        validated = self._validated_fields(node)
        namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": node.name}
        declared: dict[str, bool] = {}  # field -> required
        typed: dict[str, tuple[Any, ast.expr | None]] = {}  # field -> (annotation, default expression)
        for statement in node.body:
            if isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == [
                    "model_config"]:
                with suppress(_Unreadable):  # unreadable: the base's settings stay
                    namespace["model_config"] = self.value(statement.value)
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            field = statement.target.id
            if field.startswith("_") or self._is_classvar(statement.annotation):
                continue
            declared[field] = _is_required(statement.value)
            if field not in validated:
                typed[field] = (statement.annotation, statement.value)
        # A base field that a validator of the case may convert: presence only, with the base's default.
        for field in validated & set(base.model_fields) - set(declared):
            declared[field] = base.model_fields[field].is_required()
            if not declared[field]:
                namespace[field] = base.model_fields[field].default
        annotations: dict[str, Any] = {}
        for field, (annotation, default) in typed.items():
            try:
                annotations[field] = self.value(annotation)
                if default is not None:
                    namespace[field] = self.value(default)
            except _Unreadable:
                annotations.pop(field, None)
                namespace.pop(field, None)
        try:
            annotations = _loose(declared, annotations, namespace)
            return type(node.name, (base,), {**namespace, "__annotations__": annotations})
        except Exception:  # a combination the reader got wrong (a constraint its type does not take)
            for field in typed:
                namespace.pop(field, None)
            annotations = _loose(declared, {}, namespace)
            return type(node.name, (base,), {**namespace, "__annotations__": annotations})

    def _is_classvar(self, annotation: ast.expr) -> bool:
        target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
        try:
            return self.value(target) is ClassVar
        except _Unreadable:
            return False

    def _validated_fields(self, node: ast.ClassDef) -> set[str]:
        """Fields the case's own field validators (which are not run here) may convert: typed as Any."""
        found: set[str] = set()
        for statement in node.body:
            for decorator in getattr(statement, "decorator_list", []):
                if isinstance(decorator, ast.Call):
                    found.update(a.value for a in decorator.args
                                 if isinstance(a, ast.Constant) and isinstance(a.value, str))
        return found


def _loose(declared: dict[str, bool], annotations: dict[str, Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """The annotations, with Any for every declared field the reader could not type (checked for presence
    only; a default it could not read is None, so that leaving the key out stays valid)."""
    for field, required in declared.items():
        if field not in annotations:
            annotations[field] = Any
            if not required:
                namespace.setdefault(field, None)
    return annotations


def _is_required(value: ast.expr | None) -> bool:
    """No default: nothing after the annotation, ``...``, or Field(...) without a default or default_factory."""
    if value is None:
        return True
    if isinstance(value, ast.Constant) and value.value is Ellipsis:
        return True
    if isinstance(value, ast.Call) and (getattr(value.func, "id", None) == "Field"
                                        or getattr(value.func, "attr", None) == "Field"):
        if value.args:
            return isinstance(value.args[0], ast.Constant) and value.args[0].value is Ellipsis
        return not any(k.arg in ("default", "default_factory") for k in value.keywords)
    return False


def read_case_module(path: Path, family: str, required: tuple[str, ...], manifest_source: str, entry: str
                     ) -> type[BaseModel]:
    """The case module at ``path``, checked without running it; returns its ``Config`` as rebuilt from the
    source (see the module docstring)."""
    source = display_path(path)
    text = read_config_text(path, manifest_source, "entry")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(source, f"line {exc.lineno}" if exc.lineno else None, f"invalid Python: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ConfigError(source, None, "cannot be parsed as Python") from None
    module = _Module(tree, path, family)
    for attr in ("Config", *required):
        if attr not in module.names:
            raise ConfigError(manifest_source, "entry", f"{entry} has no {attr!r}")
    if "Config" in module.classes:
        return module.model("Config")
    try:
        config = module.name("Config")  # imported, e.g. a config of the core
    except _Unreadable:
        raise ConfigError(source, "Config", "is not a class of this module or a config class of flagperf, so it "
                                            "cannot be checked without running the case") from None
    if not (isinstance(config, type) and issubclass(config, CaseConfig)):
        raise ConfigError(manifest_source, "entry",
                          f"{entry}: Config must subclass flagperf.measure.casekit.CaseConfig")
    return config

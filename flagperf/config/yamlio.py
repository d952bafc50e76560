"""YAML loading with the checks a config file deserves: duplicate keys are errors, 4.12e9 is a float."""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from flagperf.config.files import read_config_text
from flagperf.errors import ConfigError
from flagperf.paths import display_path


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and reads YAML 1.2 floats such as ``4.12e9``.

    PyYAML follows YAML 1.1, where ``4.12e9`` (no sign in the exponent) is a string; FlagPerf works
    around that with ``eval``. Here it is simply a float.
    """


_FLOAT_1_2 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_StrictLoader.yaml_implicit_resolvers = {
    key: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, "a key must be a scalar", key_node.start_mark)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# A config file is small: this many values, aliases expanded, is far beyond any real one, and far below what
# an alias bomb (a dozen lines that expand to billions of values) would cost to read or to print.
MAX_EXPANDED_VALUES = 100_000


class AliasBomb(yaml.YAMLError):
    def __init__(self, mark: yaml.Mark | None) -> None:
        super().__init__()
        self.mark = mark


def _expanded_size(root: yaml.Node) -> int:
    """How many values the document holds once every alias is expanded (shared nodes counted each time they
    are used), without expanding anything: sizes are memoised per node; stops at the limit."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int = 0) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if depth > 200:
            raise AliasBomb(node.start_mark)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        if total > MAX_EXPANDED_VALUES:
            raise AliasBomb(node.start_mark)
        sizes[id(node)] = total
        return total

    return size(root)


class _BoundedLoader(_StrictLoader):
    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node)
        return node


# Text in a config file is short: a description is a paragraph, a name a word. Longer values are refused with
# their key (a 10 MB description would otherwise be carried into every plan, log line and report).
MAX_TEXT = 4096
MAX_KEY = 256
# A line this long cannot hold a valid value; refused before parsing, which would take seconds per megabyte.
MAX_LINE = 4 * MAX_TEXT
_LONG_LINE = re.compile(rf"[^\n]{{{MAX_LINE + 1}}}")
_LINE_KEY = re.compile(r"\s*(?:-\s+)*['\"]?([^'\"\s:#][^:#\n]{0,80}?)['\"]?\s*:(?:\s|$)")


def _long_line(text: str, source: str) -> None:
    found = _LONG_LINE.search(text)
    if found is None:
        return
    start = text.rfind("\n", 0, found.start()) + 1
    line = text.count("\n", 0, start) + 1
    key = _LINE_KEY.match(text, start, start + 200)
    where = f"{key.group(1).strip()} (line {line})" if key else f"line {line}"
    raise ConfigError(source, where, f"a line longer than {MAX_LINE} characters; a config value is at most "
                                     f"{MAX_TEXT}; not read")


def _check_lengths(data: Any, source: str, path: str = "") -> None:
    """Every string (value or key) within its bound, the offending one named by its dotted key."""
    if isinstance(data, str):
        if len(data) > MAX_TEXT:
            raise ConfigError(source, path or None, f"{len(data)} characters; a config value is at most {MAX_TEXT}")
    elif isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str) and len(key) > MAX_KEY:
                raise ConfigError(source, f"{path}.{key[:40]}..." if path else f"{key[:40]}...",
                                  f"a key of {len(key)} characters; a key is at most {MAX_KEY}")
            _check_lengths(value, source, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _check_lengths(value, source, f"{path}.{index}" if path else str(index))


def parse_yaml_text(text: str, source: str) -> Any:
    _long_line(text, source)
    try:
        data = yaml.load(text, Loader=_BoundedLoader)
    except RecursionError:
        raise ConfigError(source, None, "nested too deeply; not read") from None
    except AliasBomb as exc:
        where = f"line {exc.mark.line + 1}" if exc.mark else None
        raise ConfigError(source, where, f"aliases expand to more than {MAX_EXPANDED_VALUES} values (or nest "
                                         "deeper than 200); not read") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark else None
        raise ConfigError(source, where, f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:  # e.g. a ReaderError for a control character: keep it to one line
        raise ConfigError(source, None, "invalid YAML: " + " ".join(str(exc).split())) from None
    _check_lengths(data, source)
    return data


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML file whose top level must be a mapping with string keys. Only a regular file is read
    (flagperf.config.files): a FIFO, a device or a folder is one error line, never a hang."""
    source = display_path(path)
    data = parse_yaml_text(read_config_text(path, source), source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, None, f"top level must be a mapping, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(source, str(key), "keys must be strings")
    return data

"""flagperf.config.yamlio: strict YAML loading, every error one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from flagperf.config.yamlio import load_yaml_mapping, parse_yaml_text
from flagperf.errors import ConfigError


def _one_line_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_yaml_mapping(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(path) in message or path.name in message
    return info.value


def test_valid_mapping_is_returned(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("a: 1\nb: [1, 2]\nc: {d: x}\n", encoding="utf-8")
    assert load_yaml_mapping(path) == {"a": 1, "b": [1, 2], "c": {"d": "x"}}


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# only a comment\n", encoding="utf-8")
    assert load_yaml_mapping(path) == {}


def test_duplicate_key_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n", encoding="utf-8")
    err = _one_line_error(path)
    assert str(err) == f"{path}: line 3: invalid YAML: duplicate key 'a'"
    assert err.source == str(path)
    assert err.key == "line 3"


def test_duplicate_key_in_nested_mapping(tmp_path: Path) -> None:
    path = tmp_path / "nested.yaml"
    path.write_text("outer:\n  x: 1\n  y: 2\n  x: 3\n", encoding="utf-8")
    err = _one_line_error(path)
    assert "line 4" in str(err)
    assert "duplicate key 'x'" in str(err)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.12e9", 4.12e9),
        ("1e9", 1e9),
        ("1.5E-3", 1.5e-3),
        ("2.", 2.0),
        (".5", 0.5),
        ("-2.5e+2", -250.0),
        ("1_000.5", 1000.5),
    ],
)
def test_yaml_1_2_floats(text: str, expected: float) -> None:
    value = parse_yaml_text(f"v: {text}", "t.yaml")["v"]
    assert type(value) is float
    assert value == expected


def test_special_floats() -> None:
    data = parse_yaml_text("a: .inf\nb: -.inf\nc: .nan", "t.yaml")
    assert data["a"] == float("inf")
    assert data["b"] == float("-inf")
    assert data["c"] != data["c"]  # NaN


@pytest.mark.parametrize(("text", "expected"), [("2048", 2048), ("-3", -3), ("true", True), ("null", None),
                                                  ("abc", "abc"), ("'4.12e9'", "4.12e9"), ("1.2.3", "1.2.3")])
def test_other_scalars_keep_their_types(text: str, expected: object) -> None:
    value = parse_yaml_text(f"v: {text}", "t.yaml")["v"]
    assert value == expected
    assert type(value) is type(expected)


def test_signed_float_without_leading_digit() -> None:
    assert parse_yaml_text("v: -.5", "t.yaml")["v"] == -0.5


@pytest.mark.parametrize(("text", "kind"), [("- 1\n- 2\n", "list"), ("just a string\n", "str"), ("42\n", "int")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "top.yaml"
    path.write_text(text, encoding="utf-8")
    err = _one_line_error(path)
    assert f"top level must be a mapping, got {kind}" in str(err)


def test_non_string_top_level_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("1: a\n", encoding="utf-8")
    err = _one_line_error(path)
    assert "keys must be strings" in str(err)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    err = _one_line_error(path)
    assert str(err) == f"{path}: file not found"


def test_directory(tmp_path: Path) -> None:
    path = tmp_path / "dir.yaml"
    path.mkdir()
    err = _one_line_error(path)
    assert "is a directory" in str(err)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    err = _one_line_error(path)
    assert str(err) == f"{path}: not UTF-8 text"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: [1, 2\nb: 3\n", None),
        ("a: b: c\n", "line 1"),
        ("a: 1\n  b: 2\n", "line 2"),
        ("a:\n\t- 1\n", "line 2"),
        ("---\na: 1\n---\nb: 2\n", "line 3"),
        ("a: !!python/object:os.system x\n", "line 1"),
    ],
)
def test_invalid_yaml_is_one_line_with_file(tmp_path: Path, text: str, line: str | None) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    err = _one_line_error(path)
    assert str(err).startswith(f"{path}: ")
    assert "invalid YAML" in str(err)
    if line:
        assert f": {line}: " in str(err)


def test_project_file_is_shown_relative(tmp_path: Path) -> None:
    # A file inside the project is named relative to it (shorter messages); outside, by its own path.
    from flagperf.paths import PROJECT_ROOT

    inside = PROJECT_ROOT / "cases" / "base" / "no-such-case-for-tests" / "case.yaml"
    with pytest.raises(ConfigError) as info:
        load_yaml_mapping(inside)
    assert str(info.value) == "cases/base/no-such-case-for-tests/case.yaml: file not found"


def test_control_character_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ctrl.yaml"
    path.write_text("a: b\x07c\n", encoding="utf-8")
    _one_line_error(path)


def test_unhashable_key_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "listkey.yaml"
    path.write_text("[a, b]: 1\n", encoding="utf-8")
    _one_line_error(path)

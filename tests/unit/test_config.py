"""flagperf.config.models: FlagPerf's vendor override rules, run overrides, --set parsing and suite files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flagperf.config.models import (
    CaseManifest,
    SetOverride,
    apply_run_overrides,
    load_suite,
    merge_vendor_overrides,
    parse_set_override,
)
from flagperf.config.plan import plan_run
from flagperf.errors import ConfigError

DEFAULTS = "cases/base/c/case.yaml"
VENDOR = "cases/base/c/vendor/acme.yaml"


def merge(configurations: dict, overrides: dict, parameters: dict | None = None):
    return merge_vendor_overrides(configurations, parameters or {}, overrides,
                                  defaults_source=DEFAULTS, vendor_source=VENDOR)


# --- merge_vendor_overrides -------------------------------------------------------------------------------


def test_no_overrides_keeps_defaults_and_their_origin() -> None:
    merged = merge({"m": 4096, "warmup_iters": 10}, {}, parameters={"precision": "fp32"})
    assert merged.values == {"m": 4096, "warmup_iters": 10, "precision": "fp32"}
    assert merged.origins == dict.fromkeys(("m", "warmup_iters", "precision"), DEFAULTS)
    assert merged.parameters == frozenset({"precision"})
    assert merged.vendor_changes == {}
    assert merged.vendor_new_keys == []


def test_new_key_warns_and_is_applied(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flagperf.config.models"):
        merged = merge({"m": 1}, {"extra_knob": 7})
    assert merged.values["extra_knob"] == 7
    assert merged.origins["extra_knob"] == VENDOR
    assert merged.vendor_new_keys == ["extra_knob"]
    assert merged.vendor_changes == {}
    warnings = [r for r in caplog.records if r.name == "flagperf.config.models" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "extra_knob" in warnings[0].getMessage()
    assert VENDOR in warnings[0].getMessage()


def test_changed_key_is_logged_at_debug_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    """Each change is a DEBUG line (a run's log would open with dozens); the plan says them in one INFO line."""
    with caplog.at_level(logging.DEBUG, logger="flagperf.config.models"):
        merged = merge({"m": 4096, "n": 4096}, {"m": 2048})
    assert merged.values == {"m": 2048, "n": 4096}
    assert merged.origins == {"m": VENDOR, "n": DEFAULTS}
    assert merged.vendor_changes == {"m": (4096, 2048)}
    records = [r for r in caplog.records if r.name == "flagperf.config.models"]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert "4096 -> 2048" in records[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_override_equal_to_default_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"m": 4096, "n": 1}, {"n": 2, "m": 4096})
    assert info.value.source == VENDOR
    assert info.value.key == "m"
    assert str(info.value).startswith(f"{VENDOR}: m: overrides the default with the same value")


@pytest.mark.parametrize(("default", "override"), [(1, 1.0), (1, True), (1.0, True), (0, False), ("1", 1),
                                                   (None, 0)])
def test_equality_is_type_strict(default: object, override: object) -> None:
    merged = merge({"k": default}, {"k": override})
    assert merged.values["k"] is override or merged.values["k"] == override
    assert type(merged.values["k"]) is type(override)
    assert merged.vendor_changes == {"k": (default, override)}


@pytest.mark.parametrize("value", [1, 1.5, True, None, "s", [1, 2], {"a": 1}])
def test_same_type_same_value_is_an_error_for_every_type(value: object) -> None:
    with pytest.raises(ConfigError, match="same value"):
        merge({"k": value}, {"k": value})


def test_overriding_a_parameter_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"m": 1}, {"precision": "fp64"}, parameters={"precision": "fp32"})
    assert info.value.source == VENDOR
    assert info.value.key == "precision"
    assert "parameter" in info.value.message


def test_key_in_configurations_and_parameters_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"m": 1, "precision": "fp32"}, {}, parameters={"precision": "fp32"})
    assert info.value.source == DEFAULTS
    assert info.value.key == "precision"


# --- apply_run_overrides ----------------------------------------------------------------------------------


def test_run_override_applied_and_origin_recorded() -> None:
    merged = merge({"m": 4096, "n": 4096}, {"m": 2048})
    apply_run_overrides(merged, {"m": 64}, "--set")
    apply_run_overrides(merged, {"n": 32}, "suite.yaml")
    assert merged.values == {"m": 64, "n": 32}
    assert merged.origins == {"m": "--set", "n": "suite.yaml"}
    assert merged.run_overrides == {"--set": {"m": 64}, "suite.yaml": {"n": 32}}
    assert merged.vendor_changes == {"m": (4096, 2048)}  # the vendor layer is still reported


def test_run_override_unknown_key_lists_known_keys() -> None:
    merged = merge({"m": 1, "k": 2}, {}, parameters={"precision": "fp32"})
    with pytest.raises(ConfigError) as info:
        apply_run_overrides(merged, {"q": 1}, "--set")
    assert info.value.source == "--set"
    assert info.value.key == "q"
    assert info.value.message == "unknown key (known: k, m)"  # parameters are not offered


def test_run_override_of_vendor_new_key_is_allowed() -> None:
    merged = merge({"m": 1}, {"extra": 1})
    apply_run_overrides(merged, {"extra": 2}, "--set")
    assert merged.values["extra"] == 2


def test_run_override_cannot_touch_a_parameter() -> None:
    merged = merge({"m": 1}, {}, parameters={"precision": "fp32"})
    with pytest.raises(ConfigError) as info:
        apply_run_overrides(merged, {"precision": "fp64"}, "suite.yaml")
    assert info.value.source == "suite.yaml"
    assert info.value.key == "precision"
    assert merged.values["precision"] == "fp32"


# --- parse_set_override -----------------------------------------------------------------------------------


def test_set_plain_key() -> None:
    o = parse_set_override("m=2048", ["computation-FP32"])
    assert (o.case, o.key, o.value, o.text) == (None, "m", 2048, "m=2048")
    assert type(o.value) is int


@pytest.mark.parametrize(("raw", "expected"), [("2048", 2048), ("0.5", 0.5), ("4.12e9", 4.12e9), ("true", True),
                                               ("false", False), ("null", None), ("abc", "abc"), ("'12'", "12"),
                                               ("a=b", "a=b"), ("", "")])
def test_set_value_is_typed_as_yaml(raw: str, expected: object) -> None:
    value = parse_set_override(f"k={raw}", []).value
    assert value == expected
    assert type(value) is type(expected)


def test_set_case_prefix_with_dots_and_dashes() -> None:
    names = ["computation-FP32", "my.case", "my.case.v2", "a-b.c"]
    o = parse_set_override("computation-FP32.m=64", names)
    assert (o.case, o.key, o.value) == ("computation-FP32", "m", 64)
    o = parse_set_override("my.case.v2.min_duration_s=0.5", names)  # the longest matching name wins
    assert (o.case, o.key, o.value) == ("my.case.v2", "min_duration_s", 0.5)
    o = parse_set_override("my.case.k=1", names)
    assert (o.case, o.key) == ("my.case", "k")
    o = parse_set_override("a-b.c.max_gib=2", names)
    assert (o.case, o.key, o.value) == ("a-b.c", "max_gib", 2)


def test_set_whitespace_around_key() -> None:
    o = parse_set_override(" m = 3", [])
    assert (o.key, o.value) == ("m", 3)


def test_set_missing_equals() -> None:
    with pytest.raises(ConfigError) as info:
        parse_set_override("m2048", [])
    assert info.value.source == "--set"
    assert "KEY=VALUE" in str(info.value)


def test_set_on_a_case_that_is_not_selected_names_the_selection() -> None:
    with pytest.raises(ConfigError) as info:  # a key part that cannot be a key: only a case name was meant
        parse_set_override("unknown-case.m=1", ["computation-FP32"])
    assert info.value.message == "no selected case is named 'unknown-case' (selected: computation-FP32)"
    with pytest.raises(ConfigError) as info:  # a case or a mapping's key: neither, both said
        plan_run(cases=["computation-FP32"], sets=["unknowncase.m=1"], results_dir="unused")
    assert info.value.key == "unknowncase.m" and "\n" not in str(info.value)
    assert info.value.message.startswith("no selected case is named 'unknowncase' (selected: computation-FP32), and "
                                         "no selected case has this key (")


def test_set_a_dotted_key_is_a_case_only_where_it_names_a_case_of_the_run() -> None:
    """`--set slo.ttft_s=0.5`: slo is no case of the run, so it is the key of a mapping; `CASE.slo.ttft_s` sets it
    in that case only; where a case of the run is named slo, `slo.ttft_s` is that case's key ttft_s."""
    assert parse_set_override("slo.ttft_s=0.5", ["tiny-llama-serve"]) == SetOverride(
        case=None, key="slo.ttft_s", value=0.5, text="slo.ttft_s=0.5")
    assert parse_set_override("tiny-llama-serve.slo.ttft_s=0.5", ["tiny-llama-serve"]).case == "tiny-llama-serve"
    assert parse_set_override("tiny-llama-serve.slo.ttft_s=0.5", ["tiny-llama-serve"]).key == "slo.ttft_s"
    named = parse_set_override("slo.ttft_s=0.5", ["tiny-llama-serve", "slo"])
    assert (named.case, named.key) == ("slo", "ttft_s")
    for sets in (["slo.ttft_s=0.5"], ["tiny-llama-serve.slo.ttft_s=0.5"]):
        case = plan_run(cases=["tiny-llama-serve"], sets=sets, results_dir="unused").cases[0]
        assert case.config["slo"] == {"ttft_s": 0.5, "tpot_s": 0.1, "e2el_s": None}  # the other bounds kept
        assert case.origins["slo.ttft_s"] == "--set" and case.run_overrides == {"--set": {"slo.ttft_s": 0.5}}
    # A case without the mapping is left alone by the case-less form, as by any --set key it lacks.
    plans = plan_run(cases=["tiny-llama-serve", "computation-FP32"], sets=["slo.ttft_s=0.5"],
                     results_dir="unused").cases
    assert plans[0].config["slo"]["ttft_s"] == 0.5 and "slo" not in plans[1].config


@pytest.mark.parametrize(("text", "message"), [
    ("slo.ttfs=0.5", "--set: slo.ttfs: unknown key (did you mean ttft_s or tpot_s?)"),
    ("slo.ttft_s.x=1", "--set: slo.ttft_s.x: slo.ttft_s is not a mapping (it is 2.0)"),
    ("input_len.x=3", "--set: input_len.x: input_len is not a mapping (it is 16), so it has no key 'x'"),
    ("endpoint.base_url=http://h:1", "--set: endpoint.base_url: endpoint is not a mapping (it is None), so it has "
                                     "no key 'base_url'"),
    ("tiny-llama-serve.slx.ttft_s=1", "--set: slx.ttft_s: unknown key 'slx' (did you mean slo?)"),
    ("slo.ttft_s=-1", "--set: slo.ttft_s: Input should be greater than 0 (got -1)"),
])
def test_a_dotted_key_that_leads_nowhere_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["tiny-llama-serve"], sets=[text], results_dir="unused")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["=1", "m-n=1", "a b=1", "computation-FP32.=1", "m[0]=1"])
def test_set_bad_key(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_set_override(text, ["computation-FP32"])
    assert info.value.source == "--set"
    assert "key must be a configuration name" in info.value.message


@pytest.mark.parametrize("raw", ["[[1], 2]", "{a: 1}", "a: 1", "[{a: 1}]"])
def test_set_non_scalar_value(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_set_override(f"m={raw}", [])
    assert info.value.key == "m"
    assert info.value.message.startswith("the value must be a scalar or a list of scalars; set one key of a mapping "
                                         "by its dotted path (--set slo.ttft_s=0.5), or a whole mapping")
    assert "operation case's shapes) in a suite file's overrides (--suite FILE)" in info.value.message


def test_set_a_list_of_scalars() -> None:
    assert parse_set_override("depths=[1, 2]", []).value == [1, 2]


def test_set_invalid_yaml_value() -> None:
    with pytest.raises(ConfigError) as info:
        parse_set_override("m=[1", [])
    assert info.value.source == "--set"
    assert "\n" not in str(info.value)


# --- CaseManifest and suite files -------------------------------------------------------------------------


def _manifest(**extra: object) -> dict:
    return {"name": "c", "family": "base", "description": "d", "configurations": {"m": 1}, **extra}


@pytest.mark.parametrize("entry", ["bench.py", "other_kernel.py", "flagperf.basespec.gemm", "flagperf.basespec.my_k"])
def test_manifest_accepts_entries(entry: str) -> None:
    assert CaseManifest.model_validate(_manifest(entry=entry)).entry == entry


@pytest.mark.parametrize("entry", ["sub/bench.py", "..\\bench.py", "bench.txt", "flagperf.basespec.Gemm",
                                   "flagperf.basespec.", "flagperf.basespec.a.b"])
def test_manifest_rejects_entries(entry: str) -> None:
    with pytest.raises(ValueError):
        CaseManifest.model_validate(_manifest(entry=entry))


@pytest.mark.parametrize("name", ["-x", "a/b", "", "a b", "x" * 129])
def test_manifest_rejects_names(name: str) -> None:
    with pytest.raises(ValueError):
        CaseManifest.model_validate(_manifest(name=name))


def test_manifest_rejects_unknown_keys_and_families() -> None:
    with pytest.raises(ValueError):
        CaseManifest.model_validate(_manifest(extra=1))
    with pytest.raises(ValueError):
        CaseManifest.model_validate({**_manifest(), "family": "inference"})  # not a family yet
    with pytest.raises(ValueError, match="not configurations: nope"):
        CaseManifest.model_validate({**_manifest(), "mutable": ["nope"]})


def _suite(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_suite_ok(tmp_path: Path) -> None:
    suite = load_suite(_suite(tmp_path, "mine", "name: mine\ncases: [a, b]\nrounds: 2\noverrides: {a: {m: 1}}\n"))
    assert suite.cases == ["a", "b"]
    assert suite.rounds == 2
    assert suite.overrides == {"a": {"m": 1}}


def test_load_suite_defaults(tmp_path: Path) -> None:
    suite = load_suite(_suite(tmp_path, "mine", "name: mine\ncases: [a]\n"))
    assert (suite.rounds, suite.overrides, suite.description) == (1, {}, "")


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("name: other\ncases: [a]\n", "name", "must match the file name ('mine')"),
        ("name: mine\ncases: [a]\nround: 2\n", "round", "unknown key"),
        ("name: mine\ncases: [a]\nrounds: 0\n", "rounds", "greater than or equal to 1"),
        ("name: mine\ncases: [a]\nrounds: 101\n", "rounds", "less than or equal to 100"),
        ("name: mine\ncases: []\n", "cases", "at least 1 item"),
        ("name: mine\ncases: [a, b, a]\n", "cases", "listed more than once: a"),
        ("name: mine\ncases: ['bad name']\n", "cases", "case name"),
        ("cases: [a]\n", "name", "required key is missing"),
        ("name: mine\ncases: [a]\noverrides: {a: 1}\n", "overrides.a", "valid dictionary"),
    ],
)
def test_load_suite_errors(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = _suite(tmp_path, "mine", text)
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    assert info.value.source == str(path)
    assert info.value.key == key
    assert message in info.value.message
    assert "\n" not in str(info.value)


def test_a_kernel_whose_package_is_missing_names_the_package_not_the_kernel(monkeypatch) -> None:
    """A package the shared kernel imports is missing or broken on a host: the kernel is there, so 'no kernel
    named' would mislead. (Not torch: a kernel imports it where it runs; test_cli validates without it.)"""
    import sys

    from flagperf.config.cases import load_case

    for module in ("flagperf.basespec.gemm", "flagperf.measure.casekit"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ModuleNotFoundError(name='psutil')
    with pytest.raises(ConfigError) as raised:
        _ = load_case("computation-FP32").module
    assert "flagperf.basespec.gemm needs 'psutil'" in str(raised.value)
    assert "no kernel named" not in str(raised.value)

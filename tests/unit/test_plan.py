"""flagperf.config.plan.plan_run (and the case loading under it): everything is checked before anything runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from flagperf.config.cases import available_cases, load_case
from flagperf.config.plan import available_suites, find_suite, new_run_id, plan_run
from flagperf.errors import ConfigError
from flagperf.paths import NAME_PATTERN, PROJECT_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on 3.10
    import tomli as tomllib

FP32 = "computation-FP32"
FP32_CASE = "cases/base/computation-FP32/case.yaml"
FP32_VENDOR = "cases/base/computation-FP32/vendor/cpu.yaml"
SMOKE = "deployments/suites/smoke.yaml"


def plan(tmp_path: Path, **kwargs):
    return plan_run(results_dir=tmp_path / "results", **kwargs)


def config_error(tmp_path: Path, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# --- the real project ---------------------------------------------------------------------------------


def test_default_suite_is_smoke(tmp_path: Path) -> None:
    p = plan(tmp_path)
    assert p.suite == "smoke"
    assert p.vendor.name == "cpu"
    assert p.rounds == 1
    assert [c.name for c in p.cases] == [FP32, "computation-FP64", "main_memory-bandwidth",
                                         "main_memory-capacity"]
    assert p.results_dir == str(tmp_path / "results")
    assert p.run_dir == tmp_path / "results" / p.run_id
    assert NAME_PATTERN.match(p.run_id)
    assert not p.run_dir.exists()  # planning writes nothing


def test_smoke_origins_of_every_layer(tmp_path: Path) -> None:
    p = plan(tmp_path)
    fp32 = next(c for c in p.cases if c.name == FP32)
    assert fp32.family == "base"
    assert fp32.config["precision"] == "fp32"
    assert fp32.config["m"] == 2048
    assert fp32.config["min_duration_s"] == 3
    assert fp32.config["timeout_s"] == 900
    assert fp32.origins["m"] == FP32_VENDOR
    assert fp32.origins["warmup_iters"] == FP32_VENDOR
    assert fp32.origins["min_duration_s"] == SMOKE
    assert fp32.origins["timeout_s"] == FP32_CASE
    assert fp32.origins["precision"] == FP32_CASE
    assert fp32.vendor_changes == {"m": [4096, 2048], "n": [4096, 2048], "k": [4096, 2048],
                                   "warmup_iters": [10, 2], "sweep_m": [[1024, 16384], [256, 2048]],
                                   "sweep_n": [[1024, 16384], [256, 2048]], "sweep_k": [[1024, 16384], [256, 2048]]}
    assert fp32.vendor_new_keys == []
    assert fp32.run_overrides == {SMOKE: {"min_duration_s": 3}}
    assert fp32.timeout_s == 900.0
    assert fp32.max_retries == 2

    capacity = next(c for c in p.cases if c.name == "main_memory-capacity")
    # '*' only reaches cases that have the key; the case-specific override is applied too.
    assert "min_duration_s" not in capacity.config
    assert capacity.config["max_gib"] == 2
    assert capacity.run_overrides == {SMOKE: {"max_gib": 2}}


def test_base_suite_plans(tmp_path: Path) -> None:
    p = plan(tmp_path, suite="base")
    assert p.suite == "base"
    assert p.rounds == 3
    assert len(p.cases) == 12  # the GEMMs incl. FP8, memory, transfers and the vendor toolkit
    d2h = next(c for c in p.cases if c.name == "interconnect-d2h")
    assert set(d2h.origins.values()) == {"cases/base/interconnect-d2h/case.yaml"}  # no cpu vendor file


def test_suite_by_path(tmp_path: Path) -> None:
    p = plan(tmp_path, suite=str(PROJECT_ROOT / SMOKE))
    assert p.suite == "smoke"


def test_cases_instead_of_suite(tmp_path: Path) -> None:
    p = plan(tmp_path, cases=[FP32, "computation-FP64"], rounds=2)
    assert p.suite is None
    assert p.rounds == 2
    assert [c.name for c in p.cases] == [FP32, "computation-FP64"]
    assert p.cases[0].config["min_duration_s"] == 30  # no suite overrides with --cases
    assert p.cases[0].run_overrides == {}


def test_cases_default_to_one_round(tmp_path: Path) -> None:
    assert plan(tmp_path, cases=[FP32]).rounds == 1


def test_rounds_overrides_the_suite(tmp_path: Path) -> None:
    assert plan(tmp_path, suite="base", rounds=5).rounds == 5


def test_suite_and_cases_together(tmp_path: Path) -> None:
    err = config_error(tmp_path, suite="smoke", cases=[FP32])
    assert "not both" in str(err)


def test_unknown_case(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=["nope"])
    assert err.source == "--cases"
    assert "unknown case 'nope'" in err.message
    assert "did you mean" not in err.message  # nothing is close to it
    assert "`flagperf list cases` lists them" in err.message  # too many to list on one line


def test_unknown_case_offers_the_nearest(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=["computation-fp32"])
    assert f"did you mean {FP32}?" in err.message  # differs only in case: offered alone


def test_invalid_case_name(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=["../etc"])
    assert err.source == "--cases"


def test_duplicate_cases(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32, "computation-FP64", FP32])
    assert err.source == "--cases"
    assert err.key == FP32
    assert "more than once" in err.message


def test_unknown_vendor(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], vendor="acme")
    assert err.source == "--vendor"
    assert "unknown vendor 'acme'" in err.message
    assert "cpu" in err.message


def test_unknown_suite(tmp_path: Path) -> None:
    err = config_error(tmp_path, suite="nope")
    assert err.source == "--suite"
    assert "unknown suite 'nope'" in err.message
    assert "smoke" in err.message and "base" in err.message


@pytest.mark.parametrize("rounds", [0, -1, 101])
def test_rounds_bounds(tmp_path: Path, rounds: int) -> None:
    err = config_error(tmp_path, cases=[FP32], rounds=rounds)
    assert err.source == "--rounds"


@pytest.mark.parametrize("rounds", [1, 100])
def test_rounds_bounds_inclusive(tmp_path: Path, rounds: int) -> None:
    assert plan(tmp_path, cases=[FP32], rounds=rounds).rounds == rounds


def test_set_applies_to_every_case_having_the_key(tmp_path: Path) -> None:
    p = plan(tmp_path, sets=["min_duration_s=0.5", "max_gib=1"])
    for case in p.cases:
        if case.name == "main_memory-capacity":
            assert case.config["max_gib"] == 1
            assert case.origins["max_gib"] == "--set"  # --set comes after the suite's own override
            assert "min_duration_s" not in case.config
        else:
            assert case.config["min_duration_s"] == 0.5
            assert case.origins["min_duration_s"] == "--set"
            assert case.run_overrides["--set"] == {"min_duration_s": 0.5}
            assert case.run_overrides[SMOKE] == {"min_duration_s": 3}
    assert p.set_overrides == ["min_duration_s=0.5", "max_gib=1"]


def test_set_key_no_case_has(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], sets=["max_gib=1"])
    assert err.source == "--set"
    assert err.key == "max_gib"
    assert "no selected case has this key" in err.message
    assert "min_duration_s" in err.message  # the keys the selected cases have


def test_set_key_typo_offers_the_nearest(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], sets=["min_duraton_s=1"])
    assert "did you mean min_duration_s" in err.message


def test_set_case_specific(tmp_path: Path) -> None:
    p = plan(tmp_path, cases=[FP32, "computation-FP64"], sets=["m=512", f"{FP32}.m=64"])
    fp32, fp64 = p.cases
    assert fp32.config["m"] == 64  # the case-specific value wins over the general one
    assert fp64.config["m"] == 512
    assert fp32.origins["m"] == "--set"
    assert fp32.run_overrides == {"--set": {"m": 64}}


def test_set_case_specific_parameter(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], sets=[f"{FP32}.precision=fp64"])
    assert (err.source, err.key) == ("--set", "precision")
    assert "parameter" in err.message


def test_set_case_specific_unknown_key(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], sets=[f"{FP32}.nokey=1"])
    assert (err.source, err.key) == ("--set", "nokey")
    assert "unknown key (known: " in err.message


@pytest.mark.parametrize(("value", "message"), [("abc", "valid integer"), ("-1", "greater than 0"),
                                                 ("1.5", "valid integer"), ("70000", "less than or equal")])
def test_set_type_error_names_origin_and_key(tmp_path: Path, value: str, message: str) -> None:
    err = config_error(tmp_path, cases=[FP32], sets=[f"m={value}"])
    assert err.source == "--set"
    assert err.key == "m"
    assert message in err.message
    assert str(err).startswith("--set: m: ")


def test_existing_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results" / "run1").mkdir(parents=True)
    (tmp_path / "results" / "run1" / "notes.txt").write_text("a run's\n")
    err = config_error(tmp_path, cases=[FP32], run_id="run1")
    assert err.source == "--results"
    assert "already exists" in err.message
    assert plan(tmp_path, cases=[FP32], run_id="run2").run_id == "run2"
    # An empty folder holds nothing to overwrite (the nightly claims its run folder so before its evaluation); a
    # link to one is no run folder.
    (tmp_path / "results" / "run3").mkdir()
    assert plan(tmp_path, cases=[FP32], run_id="run3").run_id == "run3"
    (tmp_path / "results" / "run4").symlink_to(tmp_path / "results" / "run3")
    assert "already exists" in config_error(tmp_path, cases=[FP32], run_id="run4").message


def test_invalid_run_id(tmp_path: Path) -> None:
    err = config_error(tmp_path, cases=[FP32], run_id="../escape")
    assert err.source == "--run-id"


def test_new_run_ids_are_names_and_differ() -> None:
    ids = {new_run_id() for _ in range(20)}
    assert all(NAME_PATTERN.match(i) and i.startswith("run") for i in ids)
    assert len(ids) > 1


def test_plan_round_trips_through_json(tmp_path: Path) -> None:
    from flagperf.config.plan import RunPlan

    p = plan(tmp_path)
    assert RunPlan.model_validate_json(p.model_dump_json()) == p


# --- tmp case folders on FLAGPERF_CASE_PATH -------------------------------------------------------------


def test_extra_case_root_is_searched(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase")
    assert available_cases()["mycase"] == folder
    assert FP32 in available_cases()  # the project's own cases are still there
    p = plan(tmp_path, cases=["mycase"], sets=["size=3"])
    assert p.cases[0].config == {"size": 3, "label": "x", "timeout_s": 60.0, "max_retries": 0}
    assert p.cases[0].origins["size"] == "--set"
    assert p.cases[0].origins["label"] == str(folder / "case.yaml")


def test_case_path_is_read_at_call_time(tmp_path: Path, make_case, monkeypatch: pytest.MonkeyPatch) -> None:
    make_case("mycase")
    assert "mycase" in available_cases()
    monkeypatch.delenv("FLAGPERF_CASE_PATH")
    assert "mycase" not in available_cases()


def test_vendor_file_changes_are_planned(tmp_path: Path, make_case, caplog: pytest.LogCaptureFixture) -> None:
    folder = make_case("mycase", vendor={"size": 16, "new_knob": 1})
    with pytest.raises(ConfigError) as info:  # new_knob reaches the case's Config, which forbids it
        plan(tmp_path, cases=["mycase"])
    assert info.value.source == str(folder / "vendor" / "cpu.yaml")
    assert info.value.key == "new_knob"
    assert info.value.message == "unknown key (known: timeout_s, max_retries, size, label)"  # none is near
    assert any("new_knob" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_vendor_change_recorded(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", vendor={"size": 16})
    case = plan(tmp_path, cases=["mycase"]).cases[0]
    assert case.config["size"] == 16
    assert case.origins["size"] == str(folder / "vendor" / "cpu.yaml")
    assert case.vendor_changes == {"size": [8, 16]}


def test_vendor_override_equal_to_default(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", vendor="# same as the default\nsize: 8\n")
    err = config_error(tmp_path, cases=["mycase"])
    assert err.source == str(folder / "vendor" / "cpu.yaml")
    assert err.key == "size"
    assert "same value" in err.message


def test_vendor_override_of_parameter(tmp_path: Path, make_case) -> None:
    folder = make_case("mygemm", entry="flagperf.basespec.gemm", parameters={"precision": "fp32"},
                       configurations={"m": 64, "n": 64, "k": 64, "warmup_iters": 0, "min_duration_s": 0.01,
                                       "min_iters": 1, "timeout_s": 10, "max_retries": 0},
                       vendor={"precision": "fp64"})
    err = config_error(tmp_path, cases=["mygemm"])
    assert err.source == str(folder / "vendor" / "cpu.yaml")
    assert err.key == "precision"


def test_vendor_type_error_names_vendor_file(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", vendor={"size": "big"})
    err = config_error(tmp_path, cases=["mycase"])
    assert err.source == str(folder / "vendor" / "cpu.yaml")
    assert err.key == "size"


def test_default_type_error_names_case_yaml(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", configurations={"size": 0, "timeout_s": 1, "max_retries": 0})
    err = config_error(tmp_path, cases=["mycase"])
    assert err.source == str(folder / "case.yaml")
    assert err.key == "configurations.size"  # by its path in case.yaml
    assert "greater than 0" in err.message


def test_missing_required_config_key(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", configurations={"timeout_s": 1, "max_retries": 0})
    err = config_error(tmp_path, cases=["mycase"])
    assert err.source == str(folder / "case.yaml")
    assert (err.key, err.message) == ("configurations.size", "required key is missing")


def test_case_name_must_match_folder(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", manifest_extra={"name": "othername"})
    with pytest.raises(ConfigError) as info:
        load_case("mycase")
    assert info.value.source == str(folder / "case.yaml")
    assert info.value.key == "name"


def test_case_family_must_match_folder(tmp_path: Path, make_case) -> None:
    make_case("mycase", family="inference")
    with pytest.raises(ConfigError) as info:
        load_case("mycase")
    assert info.value.key == "family"


def test_case_entry_file_must_exist(tmp_path: Path, make_case) -> None:
    make_case("mycase", entry="kernel.py", bench=None)
    with pytest.raises(ConfigError) as info:
        load_case("mycase")
    assert info.value.key == "entry"
    assert "'kernel.py' does not exist" in info.value.message


def test_case_entry_without_config_or_run(tmp_path: Path, make_case) -> None:
    make_case("mycase", bench="def run(config, ctx):\n    return []\n")
    err = config_error(tmp_path, cases=["mycase"])
    assert err.key == "entry"
    assert "'Config'" in err.message


def test_case_entry_unknown_builtin_kernel(tmp_path: Path, make_case) -> None:
    make_case("mycase", entry="flagperf.basespec.nosuchkernel")
    err = config_error(tmp_path, cases=["mycase"])
    assert err.key == "entry"
    assert "no kernel named" in err.message


def test_case_defined_twice(tmp_path: Path, make_case) -> None:
    make_case(FP32)
    with pytest.raises(ConfigError) as info:
        available_cases()
    assert "also defined in cases/base/computation-FP32" in info.value.message


def test_case_entry_that_does_not_import(tmp_path: Path, make_case) -> None:
    make_case("mycase", bench="def run(:\n")
    err = config_error(tmp_path, cases=["mycase"])
    # The error points at the file with the bug, and at the line.
    assert err.source.endswith("mycase/bench.py")
    assert "line 1 SyntaxError" in err.message
    assert "\n" not in str(err)


def test_case_config_not_a_case_config(tmp_path: Path, make_case) -> None:
    bench = ("from pydantic import BaseModel\n\nclass Config(BaseModel):\n    size: int\n\n"
             "def run(config, ctx):\n    return []\n")
    make_case("mycase", configurations={"size": 1}, bench=bench)
    config_error(tmp_path, cases=["mycase"])


# --- suite files on FLAGPERF_SUITE_PATH -------------------------------------------------------------------


def test_extra_suite_root(tmp_path: Path, suite_root: Path, yaml_writer) -> None:
    path = yaml_writer(suite_root / "mine.yaml", {"name": "mine", "cases": [FP32], "rounds": 4,
                                                  "overrides": {"*": {"m": 128}, FP32: {"n": 64}}})
    assert available_suites()["mine"] == path
    assert find_suite("mine") == path
    p = plan(tmp_path, suite="mine")
    assert (p.suite, p.rounds) == ("mine", 4)
    case = p.cases[0]
    assert (case.config["m"], case.config["n"], case.config["k"]) == (128, 64, 2048)
    assert case.origins["m"] == case.origins["n"] == str(path)
    assert case.run_overrides == {str(path): {"m": 128, "n": 64}}


def test_suite_case_override_wins_over_star(tmp_path: Path, suite_root: Path, yaml_writer) -> None:
    yaml_writer(suite_root / "mine.yaml", {"name": "mine", "cases": [FP32, "computation-FP64"],
                                           "overrides": {"*": {"m": 128}, FP32: {"m": 64}}})
    fp32, fp64 = plan(tmp_path, suite="mine").cases
    assert (fp32.config["m"], fp64.config["m"]) == (64, 128)
    assert plan(tmp_path, suite="mine", sets=["m=32"]).cases[0].config["m"] == 32  # --set wins over the suite


def test_project_suite_shadows_extra_suite_of_same_name(tmp_path: Path, suite_root: Path, yaml_writer) -> None:
    yaml_writer(suite_root / "smoke.yaml", {"name": "smoke", "cases": [FP32]})
    assert available_suites()["smoke"].parent.name == "suites"
    assert len(plan(tmp_path).cases) == 4


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        ({"name": "other", "cases": [FP32]}, "name", "must match the file name"),
        ({"name": "mine", "cases": [FP32], "extra": 1}, "extra", "unknown key"),
        ({"name": "mine", "cases": [FP32], "rounds": 0}, "rounds", "greater than or equal to 1"),
        ({"name": "mine", "cases": []}, "cases", "at least 1 item"),
        ({"name": "mine", "cases": [FP32], "overrides": {"computation-FP64": {"m": 1}}},
         "overrides.computation-FP64", "is not one of the suite's cases"),
        ({"name": "mine", "cases": [FP32], "overrides": {"*": {"max_gib": 1}}},
         "overrides.*.max_gib", "no selected case has this key"),
        ({"name": "mine", "cases": [FP32], "overrides": {FP32: {"nokey": 1}}}, f"overrides.{FP32}.nokey",
         "unknown key"),
        ({"name": "mine", "cases": [FP32], "overrides": {FP32: {"precision": "fp64"}}}, f"overrides.{FP32}.precision",
         "parameter"),
    ],
)
def test_bad_suite_files(tmp_path: Path, suite_root: Path, yaml_writer, data: dict, key: str,
                         message: str) -> None:
    path = yaml_writer(suite_root / "mine.yaml", data)
    err = config_error(tmp_path, suite="mine")
    assert err.source == str(path)
    assert err.key == key
    assert message in err.message


def test_suite_type_error_names_suite_file(tmp_path: Path, suite_root: Path, yaml_writer) -> None:
    path = yaml_writer(suite_root / "mine.yaml", {"name": "mine", "cases": [FP32], "overrides": {"*": {"m": "x"}}})
    err = config_error(tmp_path, suite="mine")
    assert (err.source, err.key) == (str(path), "overrides.*.m")  # its path in the suite file


def test_suite_with_unknown_case_names_the_suite(tmp_path: Path, suite_root: Path, yaml_writer) -> None:
    path = yaml_writer(suite_root / "mine.yaml", {"name": "mine", "cases": [FP32, "nope"]})
    err = config_error(tmp_path, suite="mine")
    assert err.source == str(path)


def test_a_retry_resumes_only_its_own_run_with_the_same_code(tmp_path: Path) -> None:
    from flagperf.config.plan import PLAN_FILE, RunPlan

    first = plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / PLAN_FILE).write_text(first.model_dump_json())
    again = plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    assert again.run_id == "run-a"  # the same flow run, the same work: resumable
    with pytest.raises(ConfigError, match="already exists"):
        plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-2")
    with pytest.raises(ConfigError, match="already exists"):
        plan_run(cases=[FP32], sets=["m=1024"], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    other_code = RunPlan.model_validate({**first.model_dump(), "git_revision": "0" * 40})
    (tmp_path / "run-a" / PLAN_FILE).write_text(other_code.model_dump_json())
    with pytest.raises(ConfigError, match="different code"):
        plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    # The same commit (or no git at all) with other code: the source digest tells.
    assert first.source_digest and first.source_digest.startswith("sha256:")
    edited = RunPlan.model_validate({**first.model_dump(), "source_digest": "sha256:0000000000000000"})
    (tmp_path / "run-a" / PLAN_FILE).write_text(edited.model_dump_json())
    with pytest.raises(ConfigError, match=r"source_digest: .*sha256:0000000000000000.*different code"):
        plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1")
    # The digest covers the run's own cases (and vendor) where they lie on the search paths: a retry asking for
    # other cases is refused as other work, not as other code.
    other = plan_run(cases=["computation-FP64"], results_dir=tmp_path / "elsewhere", run_id="run-a", flow_run_id="f-1")
    (tmp_path / "run-a" / PLAN_FILE).write_text(RunPlan.model_validate(
        {**other.model_dump(), "source_digest": "sha256:1111111111111111"}).model_dump_json())
    with pytest.raises(ConfigError, match="planned other work"):
        plan_run(cases=[FP32], results_dir=tmp_path, run_id="run-a", flow_run_id="f-1", resume=True)


def test_a_retry_with_another_vendor_is_other_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vendor copied from another (an external acme from cpu) plans the same cases and settings, and its digest
    differs: the retry is refused as other work, naming both vendors, never resumed."""
    import shutil

    from flagperf.config.plan import PLAN_FILE

    shutil.copytree(PROJECT_ROOT / "vendor_images" / "cpu", tmp_path / "vendors" / "acme")
    yaml_file = tmp_path / "vendors" / "acme" / "vendor.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("name: cpu", "name: acme", 1))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    first = plan_run(cases=[FP32], results_dir=tmp_path / "results", run_id="run-a", flow_run_id="f-1")
    (tmp_path / "results" / "run-a").mkdir(parents=True)
    (tmp_path / "results" / "run-a" / PLAN_FILE).write_text(first.model_dump_json())
    with pytest.raises(ConfigError, match="already exists"):
        plan_run(cases=[FP32], vendor="acme", results_dir=tmp_path / "results", run_id="run-a", flow_run_id="f-1")
    with pytest.raises(ConfigError) as err:
        plan_run(cases=[FP32], vendor="acme", results_dir=tmp_path / "results", run_id="run-a", resume=True)
    assert "planned other work (vendor cpu, the retry asks for acme)" in str(err.value)
    assert "\n" not in str(err.value)


def test_every_package_the_project_installs_is_counted_by_the_source_digest() -> None:
    """The packages pyproject.toml installs (flows import tasks/) are code a round runs: each is among the digest's
    folders (tasks/ was not: an edit of a task left the digest as it was)."""
    from flagperf.results.provenance import SOURCE_FOLDERS

    found = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {pattern.removesuffix("*").removesuffix(".") for pattern in found["include"]}
    assert packages and packages <= set(SOURCE_FOLDERS), packages - set(SOURCE_FOLDERS)
    assert all((PROJECT_ROOT / package / "__init__.py").is_file() for package in packages)


def test_the_source_digest_follows_the_code_and_nothing_else(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy deployed without git is identified by its code: any file of the code folders changes it,
    caches, hidden folders and other folders do not. One process sees edits between two calls (a flow's retry)."""
    from flagperf.results.provenance import SOURCE_FOLDERS, listing_digest, source_digest

    for folder in SOURCE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text(f"# {folder}\n")
    (tmp_path / "cases" / "x").mkdir()
    (tmp_path / "cases" / "x" / "case.yaml").write_text("name: x\n")
    first = source_digest(tmp_path)
    assert first.startswith("sha256:") and len(first) == len("sha256:") + 16
    (tmp_path / "flagperf" / "__pycache__").mkdir()
    (tmp_path / "flagperf" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "flagperf" / ".cache").mkdir()
    (tmp_path / "flagperf" / ".cache" / "x").write_text("x")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    assert source_digest(tmp_path) == first
    (tmp_path / "cases" / "x" / "case.yaml").write_text("name: yy\n")
    changed = source_digest(tmp_path)
    assert changed != first
    (tmp_path / "cases" / "x" / "case.yaml").rename(tmp_path / "cases" / "x" / "other.yaml")  # a rename too
    assert source_digest(tmp_path) not in (first, changed)
    (tmp_path / "cases" / "x" / "other.yaml~").write_text("an editor's backup")
    renamed = source_digest(tmp_path)
    (tmp_path / "cases" / "x" / "other.yaml~").unlink()
    assert source_digest(tmp_path) == renamed
    # A file that cannot be read (deleted during the walk, another user's): no digest, and no error.
    read_bytes = Path.read_bytes

    def unreadable(path: Path) -> bytes:
        if path.name == "other.yaml":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    listing_digest.cache_clear()  # the files are as they were: their bytes would not be read again
    assert source_digest(tmp_path) is None
    monkeypatch.undo()
    listing_digest.cache_clear()


def test_a_rounds_source_digest_is_the_plans_wherever_its_vendor_and_cases_lie(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Vendor and case folders outside the project (FLAGPERF_VENDOR_PATH, FLAGPERF_CASE_PATH) count in the source
    digest by what they are (the variable and their name below its folder), not by where they lie: a round that
    finds them in other folders holding only the run's own, as a container does under /flagperf-search, records
    the plan's digest. Another vendor or case beside them does not count; an edit of the run's does."""
    import shutil

    from flagperf.config.job import Job
    from flagperf.entry import run_job
    from flagperf.results.provenance import source_digest
    from flagperf.results.schema import read_result

    def digest(**run: Any) -> str | None:
        return source_digest(**run)

    lab = tmp_path / "lab"
    engine = lab / "vendors" / "cpu" / "generate" / "mine" / "engine.yaml"  # the cpu vendor's own engine, kept aside
    engine.parent.mkdir(parents=True)
    engine.write_text("name: mine\n")
    (lab / "vendors" / "other").mkdir()
    (lab / "vendors" / "other" / "vendor.yaml").write_text("name: other\n")
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "cases" / "base" / "env-check",
                    lab / "cases" / "base" / "env-check")
    (lab / "cases" / "base" / "not-in-the-run").mkdir()
    (lab / "cases" / "base" / "not-in-the-run" / "notes.txt").write_text("x\n")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(lab / "vendors"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(lab / "cases"))
    plan = plan_run(cases=["env-check", FP32], sets=["env-check.expect_name=HOME", "env-check.expect_sha256=x",
                                                     "env-check.absent="], results_dir=tmp_path / "results")
    assert plan.case_folders == ["base/env-check", f"base/{FP32}"]
    assert plan.source_digest == digest(vendor="cpu", cases=plan.case_folders)
    assert plan.source_code == {  # what it counted, for a lab to see: the run's own, not the vendor beside them
        "FLAGPERF_VENDOR_PATH/cpu/generate/mine": {"folder": str(engine.parent), "skip": []},
        "FLAGPERF_CASE_PATH/base/env-check": {"folder": str(lab / "cases" / "base" / "env-check"), "skip": []}}
    # A container's view: the run's vendor and case alone, elsewhere.
    seen = tmp_path / "flagperf-search"
    shutil.copytree(lab / "vendors" / "cpu", seen / "vendor" / "0" / "cpu")
    shutil.copytree(lab / "cases" / "base" / "env-check", seen / "case" / "0" / "base" / "env-check")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(seen / "vendor" / "0"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(seen / "case" / "0"))
    case = plan.cases[0]
    job = Job(run_id=plan.run_id, case=case.name, family=case.family, round=1, host="here", vendor="cpu",
              config=case.config, config_origins=case.origins, run_overrides=case.run_overrides, image={},
              run_cases=plan.case_folders)
    out = tmp_path / "out"
    out.mkdir()
    run_job(job, out)
    result = read_result(out / "result.json")
    assert result.status == "success", result.failure
    assert result.provenance is not None and result.provenance.source_digest == plan.source_digest
    assert job.failed_result(result.failure, None).provenance.source_digest == plan.source_digest  # a lost round's
    # Beside the run's: not counted (the other vendor is where no run is named: a run could name it).
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(lab / "vendors"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(lab / "cases"))
    whole = digest()
    (lab / "vendors" / "other" / "vendor.yaml").write_text("name: other\nchanged: true\n")
    (lab / "cases" / "base" / "not-in-the-run" / "notes.txt").write_text("y\n")
    assert digest(vendor="cpu", cases=plan.case_folders) == plan.source_digest
    assert digest() != whole
    # The run's own: counted, in either folder.
    engine.write_text("name: mine\n# edited\n")
    assert digest(vendor="cpu", cases=plan.case_folders) != plan.source_digest
    engine.write_text("name: mine\n")
    (lab / "cases" / "base" / "env-check" / "bench.py").write_text("# edited\n", encoding="utf-8")
    assert digest(vendor="cpu", cases=plan.case_folders) != plan.source_digest


def test_the_source_digest_counts_the_copy_of_a_name_a_run_uses_never_one_an_earlier_place_hides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run finds its vendor in the first place on FLAGPERF_VENDOR_PATH holding its vendor.yaml (the project's
    vendor_images/ first), each of its engines in the first place holding that engine among the vendor's folder and
    later folders of its name WITHOUT a vendor.yaml (a later one with its own vendor.yaml is a shadowed copy, never
    read), and a case in the first place holding its case.yaml: the digest counts those copies, so an edit of a copy a
    run never reads (a second checkout of the vendor's repository later on the path, an older copy of a case) leaves
    it as it was, and an edit of what the run reads changes it. The digest of no run (every vendor and case a run could
    name) goes by the same rule, and source_code says which copies were counted."""
    from flagperf.results.provenance import code_identity, source_code, source_digest

    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    files = {
        first / "vendors" / "acme" / "vendor.yaml": "name: acme\n",
        first / "vendors" / "acme" / "generate" / "a" / "engine.yaml": "name: a\n",
        # A full second copy (its own vendor.yaml): shadowed, never read, engine b of its own included.
        second / "vendors" / "acme" / "vendor.yaml": "name: acme\n",
        second / "vendors" / "acme" / "monitor.py": "# monitor\n",
        second / "vendors" / "acme" / "generate" / "a" / "engine.yaml": "name: a\n",
        second / "vendors" / "acme" / "generate" / "b" / "engine.yaml": "name: b\n",
        # The cpu vendor is the project's own: a copy later on the path with its own vendor.yaml is never read.
        second / "vendors" / "cpu" / "vendor.yaml": "name: cpu\n",
        second / "vendors" / "cpu" / "generate" / "c" / "engine.yaml": "name: c\n",
        # Folders without vendor.yaml only add engines to the vendor of their name.
        third / "vendors" / "acme" / "generate" / "d" / "engine.yaml": "name: d\n",
        third / "vendors" / "cpu" / "generate" / "e" / "engine.yaml": "name: e\n",
        # No vendor.yaml of the name anywhere: no run can name it, so none of it counts.
        third / "vendors" / "zed" / "generate" / "f" / "engine.yaml": "name: f\n",
        first / "cases" / "base" / "x" / "case.yaml": "name: x\n",
        second / "cases" / "base" / "x" / "case.yaml": "name: x\n",
        # y: the first place has a folder of its name but no case there; the second has the case.
        first / "cases" / "base" / "y" / "notes.txt": "no case\n",
        second / "cases" / "base" / "y" / "case.yaml": "name: y\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", f"{first / 'vendors'}:{second / 'vendors'}:{third / 'vendors'}")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", f"{first / 'cases'}:{second / 'cases'}")

    def digests() -> tuple[str | None, str | None, str | None]:
        # the whole digest (no run named: a lab's own record of its code) goes by the same rule as a run's
        return (source_digest(vendor="acme", cases=["base/x", "base/y"]),
                source_digest(vendor="cpu", cases=["base/x", "base/y"]), source_digest())

    before = digests()
    assert None not in before
    for hidden in (second / "vendors" / "acme" / "vendor.yaml", second / "vendors" / "acme" / "monitor.py",
                   second / "vendors" / "acme" / "generate" / "a" / "engine.yaml",
                   second / "vendors" / "acme" / "generate" / "b" / "engine.yaml",
                   second / "vendors" / "cpu" / "vendor.yaml",
                   second / "vendors" / "cpu" / "generate" / "c" / "engine.yaml",
                   second / "cases" / "base" / "x" / "case.yaml",
                   first / "cases" / "base" / "y" / "notes.txt",
                   third / "vendors" / "zed" / "generate" / "f" / "engine.yaml"):
        hidden.write_text(hidden.read_text() + "# edited where no run reads it\n")
        assert digests() == before, hidden
    for used, changes in ((first / "vendors" / "acme" / "vendor.yaml", (True, False, True)),
                          (first / "vendors" / "acme" / "generate" / "a" / "engine.yaml", (True, False, True)),
                          (third / "vendors" / "acme" / "generate" / "d" / "engine.yaml", (True, False, True)),
                          (third / "vendors" / "cpu" / "generate" / "e" / "engine.yaml", (False, True, True)),
                          (first / "cases" / "base" / "x" / "case.yaml", (True, True, True)),
                          (second / "cases" / "base" / "y" / "case.yaml", (True, True, True))):
        used.write_text(used.read_text() + "# edited\n")
        after = digests()
        assert tuple(a != b for a, b in zip(after, before, strict=True)) == changes, used
        before = after
    # What was counted, by label, for a lab to see (a plan records its run's): the copies read, none shadowed.
    assert source_code(vendor="acme", cases=["base/x"]) == {
        "FLAGPERF_VENDOR_PATH/acme": {"folder": str(first / "vendors" / "acme"), "skip": []},
        "FLAGPERF_VENDOR_PATH/acme/generate/d": {"folder": str(third / "vendors" / "acme" / "generate" / "d"),
                                                 "skip": []},
        "FLAGPERF_CASE_PATH/base/x": {"folder": str(first / "cases" / "base" / "x"), "skip": []}}
    assert source_code() == {
        **source_code(vendor="acme", cases=["base/x", "base/y"]),
        "FLAGPERF_VENDOR_PATH/cpu/generate/e": {"folder": str(third / "vendors" / "cpu" / "generate" / "e"),
                                                "skip": []}}
    # A benchmark record (committed) names the folders counted by label; where they lie only when asked.
    assert "FLAGPERF_VENDOR_PATH/acme/generate/d" in code_identity() and str(tmp_path) not in code_identity()
    assert str(third / "vendors" / "acme" / "generate" / "d") in code_identity(paths=True)
    # An engine an earlier place without vendor.yaml has is left out of the vendor's own folder, said by name.
    (third / "vendors" / "acme" / "generate" / "a").mkdir()
    (third / "vendors" / "acme" / "generate" / "a" / "engine.yaml").write_text("name: a\n")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", f"{third / 'vendors'}:{first / 'vendors'}")
    assert source_code(vendor="acme", cases=[])["FLAGPERF_VENDOR_PATH/acme"] == {
        "folder": str(first / "vendors" / "acme"), "skip": ["generate/a"]}


def test_a_relative_search_path_entry_is_the_folder_the_run_started_in_for_every_later_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bench_py: str, yaml_writer: Any,
        restored_process_state: None) -> None:
    """A relative FLAGPERF_CASE_PATH / FLAGPERF_VENDOR_PATH entry means the folder the command was started in, as a
    PATH entry does, fixed once when the plan is made: a round's process, which a local host starts in the project,
    reads the same folders and records the plan's source digest; the plan records them, absolute; a `--retry` started
    elsewhere, where the same entry names another copy, is refused naming both folders.
    The CLI fixes them when it starts, so a command's children (a server's worker, in the project) read them so."""
    import sys

    from typer.testing import CliRunner

    from flagperf.config.plan import PLAN_FILE
    from flagperf.hosts.local import LocalHost
    from flows.cli import app

    def lab(where: Path, label: str) -> Path:
        folder = where / "my-cases" / "base" / "own-case"
        yaml_writer(folder / "case.yaml", {"name": "own-case", "family": "base", "description": "a lab's own",
                                           "entry": "bench.py", "configurations": {"size": 8, "label": label,
                                                                                   "timeout_s": 60, "max_retries": 0}})
        (folder / "bench.py").write_text(bench_py, encoding="utf-8")
        (where / "my-vendors").mkdir()
        return where

    start = lab(tmp_path / "start", "x")
    monkeypatch.chdir(start)
    relative = {"FLAGPERF_CASE_PATH": "my-cases", "FLAGPERF_VENDOR_PATH": "my-vendors"}
    for name, value in relative.items():
        monkeypatch.setenv(name, value)
    results = tmp_path / "results"
    planned = plan_run(cases=["own-case"], results_dir=results, run_id="run-a")
    assert planned.search_paths == {"FLAGPERF_VENDOR_PATH": [str(start / "my-vendors")],
                                    "FLAGPERF_CASE_PATH": [str(start / "my-cases")]}
    # A round: a process the local host starts in the project, with the controller's environment.
    lines: list[str] = []
    digest = ("from flagperf.results.provenance import source_digest; "
              "print(source_digest(vendor='cpu', cases=['base/own-case']))")
    done = LocalHost(work_root=tmp_path / "work").run([sys.executable, "-c", digest], timeout=120,
                                                      log_path=tmp_path / "round.log", on_line=lines.append)
    assert done.exit_code == 0, lines
    assert planned.source_digest and lines[-1] == planned.source_digest, lines

    # `flagperf run --retry` from another folder, where the same entry names another copy of the case.
    (results / "run-a").mkdir(parents=True)
    (results / "run-a" / PLAN_FILE).write_text(planned.model_dump_json())
    elsewhere = lab(tmp_path / "elsewhere", "y")
    monkeypatch.chdir(elsewhere)
    for name, value in relative.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["own-case"], results_dir=results, run_id="run-a", resume=True)
    assert "planned other work" in info.value.message and "\n" not in str(info.value)
    assert (f"FLAGPERF_CASE_PATH was {start / 'my-cases'}, the retry's is {elsewhere / 'my-cases'}"
            in info.value.message), info.value.message
    # From where it was started, with the case's code edited since: other code, and said so.
    monkeypatch.chdir(start)
    for name, value in relative.items():
        monkeypatch.setenv(name, value)
    (start / "my-cases" / "base" / "own-case" / "bench.py").write_text(bench_py + "# edited\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="different code"):
        plan_run(cases=["own-case"], results_dir=results, run_id="run-a", resume=True)

    for name, value in relative.items():
        monkeypatch.setenv(name, value)
    listed = CliRunner().invoke(app, ["list", "cases"])
    assert listed.exit_code == 0 and "own-case" in listed.output, listed.output
    assert {name: os.environ[name] for name in relative} == {name: str(start / value)
                                                             for name, value in relative.items()}


def test_a_relative_search_path_entry_from_a_removed_folder_is_one_line(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder a command was started in, removed since: a relative entry names nothing. One line naming the
    variable and the entry, exit 2, no traceback (before: read from the project, `cases` named the project's own
    cases a second time, and the command said a case was defined twice). A plan made there says the same."""
    import subprocess
    import sys

    gone = tmp_path / "gone"
    gone.mkdir()
    # The shell starts in the folder and removes it; the command then starts there, as from a removed folder.
    done = subprocess.run(["/bin/sh", "-c", 'cd "$1" && rmdir "$1" && exec "$2" -c "$3" list cases', "sh", str(gone),
                           sys.executable, "from flows.cli import main; main()"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "FLAGPERF_CASE_PATH": "cases",
                                            "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == ("error: FLAGPERF_CASE_PATH: entry 'cases' is relative, and the folder this command "
                           "started in no longer exists\n"), done.stderr
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", f"/abs/vendors{os.pathsep}my-vendors")
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(ConfigError) as info:
        plan_run(cases=["computation-FP32"], results_dir=tmp_path / "results")
    assert str(info.value) == ("FLAGPERF_VENDOR_PATH: entry 'my-vendors' is relative, and the folder this command "
                               "started in no longer exists")

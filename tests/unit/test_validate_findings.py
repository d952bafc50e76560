"""What a new lab user meets when a config file is wrong, through the CLI: every finding of a file at once
(`flagperf validate`), each one line with the key's full path in that file and the nearest key; pydantic's own
wording kept out; a suite given where an inventory goes (and the other way round) named as such."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator
from typer.testing import CliRunner

from flagperf.config.models import SuiteFile, pydantic_error_to_config_error
from flagperf.errors import ConfigError
from flagperf.paths import PROJECT_ROOT, display_path
from flows.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # bad input is refused before the flow


def errors(*args: str) -> list[str]:
    """The error lines of a command that must fail as bad input (exit 2, no traceback)."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    return [" ".join(line.split()) for line in result.output.splitlines() if line.startswith("error")]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_typo_in_a_suites_overrides_names_its_path_and_the_nearest_key(tmp_path: Path) -> None:
    suite = write(tmp_path / "s5.yaml", "name: s5\ncases: [computation-FP32]\n"
                                        "overrides: {computation-FP32: {min_duraton_s: 2}}\n")
    assert errors("validate", str(suite)) == [
        f"error {suite}: overrides.computation-FP32.min_duraton_s: unknown key (did you mean min_duration_s?)"]
    # The same line where the suite is run.
    assert errors("run", "--suite", str(suite)) == [
        f"error: {suite}: overrides.computation-FP32.min_duraton_s: unknown key (did you mean min_duration_s?)"]


def test_validate_says_every_finding_of_a_suite_at_once(tmp_path: Path) -> None:
    suite = write(tmp_path / "s6.yaml", """\
name: s6
cases: [computation-FP32, main_memory-bandwidth, computation-FP64, computation-FP99]
overrides:
  computation-FP32: {min_duraton_s: 2, warmup_iter: 3, m: -1}
  main_memory-bandwidth: {timeout_s: "x"}
  computation-FP16: {m: 8}
""")
    lines = errors("validate", str(suite))
    assert lines[0].startswith(f"error {suite}: overrides.computation-FP16: is not one of the suite's cases"), lines
    assert lines[1].startswith(f"error {suite}: cases: unknown case 'computation-FP99' (did you mean "), lines
    assert len(lines) == 2, lines  # an unknown case: its settings cannot be checked, the others' are not either
    suite.write_text(suite.read_text().replace(", computation-FP99", "").replace("  computation-FP16: {m: 8}\n", ""))
    assert errors("validate", str(suite)) == [
        f"error {suite}: overrides.computation-FP32.min_duraton_s: unknown key (did you mean min_duration_s?)",
        f"error {suite}: overrides.computation-FP32.warmup_iter: unknown key (did you mean warmup_iters or "
        "min_iters?)",
        f"error {suite}: overrides.computation-FP32.m: Input should be greater than 0 (got -1)",
        f"error {suite}: overrides.main_memory-bandwidth.timeout_s: Input should be a valid number (got 'x')",
    ]
    # run says them all too, each its own line (it said the first alone: one fix per try)
    assert errors("run", "--suite", str(suite)) == [
        f"error: {suite}: overrides.computation-FP32.min_duraton_s: unknown key (did you mean min_duration_s?)",
        f"error: {suite}: overrides.computation-FP32.warmup_iter: unknown key (did you mean warmup_iters or "
        "min_iters?)",
        f"error: {suite}: overrides.computation-FP32.m: Input should be greater than 0 (got -1)",
        f"error: {suite}: overrides.main_memory-bandwidth.timeout_s: Input should be a valid number (got 'x')",
    ]


def test_a_suites_own_keys_are_all_said_with_the_nearest_one(tmp_path: Path) -> None:
    suite = write(tmp_path / "s7.yaml", "nme: s7\ncases: [computation-FP32]\nrounds: 0\ndescription: [x]\n")
    assert errors("validate", str(suite)) == [
        f"error {suite}: description: Input should be a valid string (got ['x'])",
        f"error {suite}: rounds: Input should be greater than or equal to 1 (got 0)",
        f"error {suite}: nme: unknown key (did you mean name?)",  # and not also "name: required key is missing"
    ]


def test_a_case_yaml_says_every_finding_with_the_nearest_key(tmp_path: Path, make_case) -> None:
    folder = make_case("typo-case", entry="flagperf.basespec.gemm", bench=None, configurations={
        "m": -3, "n": 8, "k": 8, "min_duraton_s": 1.0, "timeout_s": 60.0, "max_retries": 0},
        parameters={"precision": "fp32"}, manifest_extra={"descriptin": "x"})
    manifest = folder / "case.yaml"
    assert errors("validate", str(manifest)) == [
        f"error {manifest}: descriptin: unknown key (did you mean description?)"]
    manifest.write_text(manifest.read_text().replace("descriptin: x\n", ""), encoding="utf-8")
    lines = errors("validate", str(manifest))
    # Each key by its path in the file, as a suite's (overrides.<case>.<key>) and an inventory's are.
    assert f"error {manifest}: configurations.m: Input should be greater than 0 (got -3)" in lines, lines
    assert any(line.startswith(f"error {manifest}: configurations.min_duraton_s: unknown key (did you mean "
                               "min_duration_s") for line in lines), lines
    manifest.write_text(manifest.read_text().replace("precision: fp32", "precision: fp12"), encoding="utf-8")
    assert any(line.startswith(f"error {manifest}: parameters.precision: ")
               for line in errors("validate", str(manifest))), lines


def test_a_bad_peak_is_said_in_the_validators_words_with_the_nearest_key(tmp_path: Path, make_case) -> None:
    manifest = make_case("odd-peak", manifest_extra={"peak": "memory_bandwith"}) / "case.yaml"
    (line,) = errors("validate", str(manifest))
    assert line.startswith(f"error {manifest}: peak: unknown peak 'memory_bandwith' (did you mean "
                           "memory_bandwidth"), line
    assert "Value error" not in line and line.count("memory_bandwith'") == 1, line


def test_no_validator_error_keeps_pydantics_prefix() -> None:
    class Model(BaseModel):
        x: int

        @field_validator("x")
        @classmethod
        def _small(cls, value: int) -> int:
            if value > 3:
                raise ValueError(f"{value} is more than 3")
            if value < 0:  # (not an assert statement: pytest would rewrite its message)
                raise AssertionError("must not be negative")
            return value

    for value, said in ((5, "x: 5 is more than 3 (got 5)"), (-1, "x: must not be negative (got -1)")):
        with pytest.raises(ValidationError) as caught:
            Model(x=value)
        assert str(pydantic_error_to_config_error(caught.value, "f.yaml")) == f"f.yaml: {said}"
    with pytest.raises(ValidationError) as caught:
        SuiteFile.model_validate({"name": "s", "cases": ["a", "a"]})
    error = pydantic_error_to_config_error(caught.value, "s.yaml")
    assert str(error) == "s.yaml: cases: listed more than once: a (got ['a', 'a'])"


def test_an_inventorys_findings_are_all_said_each_at_its_path(tmp_path: Path) -> None:
    inventory = write(tmp_path / "inv.yaml", """\
vendr: cpu
hosts: [{name: a}]
""")
    assert errors("validate", str(inventory)) == [f"error {inventory}: vendr: unknown key (did you mean vendor?)"]
    inventory.write_text("""\
vendor: cpu
defaults: {transprt: local}
hosts:
  - {name: a, conect_timeout_s: 3, docker: {imagee: x}}
endpoints:
  e1: {base_url: "http://x", modl: m}
""", encoding="utf-8")
    assert errors("validate", str(inventory)) == [
        f"error {inventory}: hosts.0.docker.imagee: unknown key (known: engine, base_url, build_args, data_roots, "
        "data_mounts, extra_options)",
        f"error {inventory}: defaults.transprt: unknown key (did you mean transport?)",
        f"error {inventory}: hosts.0.conect_timeout_s: unknown key (did you mean connect_timeout_s or "
        "command_timeout_s?)",
        f"error {inventory}: endpoints.e1.modl: unknown key (did you mean model?)",
    ]


def test_a_read_write_mount_over_the_work_root_is_refused_by_validate_at_its_key(tmp_path: Path) -> None:
    """The controller keeps its ended markers in <work_root>/.ended: a read-write data mount at or above the work
    root is refused when the inventory is read (validate, a run's start), in one line at its key, not only once a
    round has built its image; read-only it passes."""
    inventory = write(tmp_path / "inv.yaml", """\
vendor: cpu
hosts:
  - {name: a, runtime: docker}
  - {name: b, runtime: docker, work_root: /data/work, docker: {data_mounts: ["/data/x", "/data:rw"]}}
""")
    assert errors("validate", str(inventory)) == [
        f"error {inventory}: hosts.1.docker.data_mounts.1: data mount '/data' is refused read-write: it is a folder "
        "above the host's work root (/data/work), where the controller keeps its own records of which attempts "
        "ended (.ended): mount it read-only, or set work_root outside it"]
    inventory.write_text(inventory.read_text(encoding="utf-8").replace("/data:rw", "/data:ro"), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(inventory)])
    assert result.exit_code == 0, result.output


def test_a_suite_that_misspells_cases_is_checked_as_a_suite(tmp_path: Path) -> None:
    """A suite is known by its other keys too (rounds, overrides ... or a key a typo away from one): its misspelt
    key is said with the key meant, not that the file is no kind of file."""
    suite = write(tmp_path / "s8.yaml", "name: s8\ncase: [computation-FP32]\nrounds: 1\n")
    assert errors("validate", str(suite)) == [f"error {suite}: case: unknown key (did you mean cases?)"]
    alone = write(tmp_path / "s9.yaml", "case: [computation-FP32]\n")  # the typo alone tells it
    assert errors("validate", str(alone)) == [f"error {alone}: case: unknown key (did you mean cases?)"]
    assert errors("run", "--suite", str(suite)) == [f"error: {suite}: case: unknown key (did you mean cases?)"]
    # An inventory, and FlagPerf's host.yaml (upper-case keys), are not taken for a suite by a key like one.
    host_yaml = write(tmp_path / "host.yaml", "HOST: ['127.0.0.1']\nCASES: {}\n")
    assert errors("validate", str(host_yaml)) == [f"error {host_yaml}: {NOT_A_KNOWN_FILE}"]


NOT_A_KNOWN_FILE = ("not a case.yaml, vendor/<vendor>.yaml, vendor.yaml, engine.yaml, toolkit.yaml, suite, "
                    "inventory or host.yaml file")


def test_a_file_with_a_name_and_a_description_is_not_taken_for_a_suite(tmp_path: Path) -> None:
    """Every engine.yaml and toolkit.yaml of the plug-ins, and mkdocs.yml, have a name and a description (or keys
    like them: site_name): none is a suite, nor is a toolkit's ``provides`` a typo of ``overrides``. validate checks
    a plug-in manifest as what it is, and says of any other file it does not know what it says, without a suite's
    findings; --inventory says the inventory's."""
    plugins = sorted([*PROJECT_ROOT.glob("vendor_images/*/*/*/engine.yaml"),
                      *PROJECT_ROOT.glob("vendor_images/*/toolkits/*/toolkit.yaml")])
    assert {p.name for p in plugins} == {"engine.yaml", "toolkit.yaml"}, plugins
    for path in plugins:
        checked = runner.invoke(app, ["validate", str(path)])
        assert checked.exit_code == 0 and (" engine " in checked.output or "(toolkit " in checked.output), \
            checked.output
    assert errors("validate", str(PROJECT_ROOT / "mkdocs.yml")) == [f"error mkdocs.yml: {NOT_A_KNOWN_FILE}"]
    engine = PROJECT_ROOT / "vendor_images" / "cpu" / "operation" / "native" / "engine.yaml"
    assert errors("run", "--inventory", str(engine))[0] == (
        f"error: {display_path(engine)}: name: unknown key (known: vendor, master_port, defaults, hosts, endpoints)")
    own = write(tmp_path / "plugin.yaml", "name: x\ndescription: y\nprovides: [z]\n")
    assert errors("validate", str(own)) == [f"error {own}: {NOT_A_KNOWN_FILE}"]


def test_a_suite_where_an_inventory_goes_and_the_other_way_round_is_named(tmp_path: Path) -> None:
    suite = write(tmp_path / "mysuite.yaml", "cases: [computation-FP32]\nname: mysuite\n")
    inventory = write(tmp_path / "inv.yaml", "defaults: {transport: local}\nhosts: [{name: a}]\n")
    assert errors("run", "--inventory", str(suite)) == [
        f"error: {suite}: cases: unknown key (this looks like a suite file; --inventory takes an inventory: hosts, "
        "defaults, vendor)",
        f"error: {suite}: name: unknown key (known: vendor, master_port, defaults, hosts, endpoints)"]
    assert errors("nightly", "--inventory", str(suite))[0].startswith(
        f"error: {suite}: cases: unknown key (this looks like a suite file;")
    assert errors("run", "--suite", str(inventory)) == [
        f"error: {inventory}: defaults: unknown key (this looks like an inventory; --suite takes a suite: name, "
        "cases, rounds, overrides)",
        f"error: {inventory}: hosts: unknown key (known: name, description, cases, rounds, overrides)"]
    assert errors("run", "--host-config", str(suite)) == [
        f"error: {suite}: HOSTS: required key is missing (this looks like a suite file; --host-config takes "
        "FlagPerf's host.yaml)"]


def test_gathered_findings_are_each_said_once() -> None:
    from flagperf.errors import gathered

    first, again, other = ConfigError("f", "a", "x"), ConfigError("f", "a", "x"), ConfigError("f", "b", "y")
    error = gathered([first, again, other])
    assert [str(e) for e in [error, *error.more]] == ["f: a: x", "f: b: y"]


def test_two_keys_with_the_same_small_value_are_two_findings(tmp_path: Path) -> None:
    # 0 is one shared object in Python: two keys holding it are not one value failing a union's members.
    suite = write(tmp_path / "s8.yaml", "name: s8\ncases: [computation-FP32]\n"
                                        "overrides: {computation-FP32: {timeout_s: 0, min_iters: 0}}\n")
    assert errors("validate", str(suite)) == [
        f"error {suite}: overrides.computation-FP32.timeout_s: Input should be greater than 0 (got 0)",
        f"error {suite}: overrides.computation-FP32.min_iters: Input should be greater than or equal to 1 (got 0)"]


def test_one_value_failing_every_member_of_a_union_is_one_finding() -> None:
    class Model(BaseModel):
        model_config = ConfigDict(strict=True)
        x: int | str
        positive: PositiveInt
        flag: bool | None = None
        at_least_one: int = Field(ge=1)

    with pytest.raises(ValidationError) as caught:
        Model.model_validate({"x": 1.5, "positive": 0, "at_least_one": 0, "flag": 0})
    for model in (Model, None):  # (None: the tags are told from the keys by their form)
        error = pydantic_error_to_config_error(caught.value, "f.yaml", model=model)
        assert [str(e) for e in [error, *error.more]] == [
            "f.yaml: x.int: Input should be a valid integer (got 1.5)",
            "f.yaml: positive: Input should be greater than 0 (got 0)",
            "f.yaml: flag: Input should be a valid boolean (got 0)",
            "f.yaml: at_least_one: Input should be greater than or equal to 1 (got 0)"], model


def test_a_typo_in_the_overrides_for_every_case_hides_no_other_finding(tmp_path: Path) -> None:
    suite = write(tmp_path / "s9.yaml", "name: s9\ncases: [computation-FP32]\n"
                                        "overrides: {'*': {min_duraton_s: 3, timeout_s: 0}}\n")
    lines = errors("validate", str(suite))
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"error {suite}: overrides.*.min_duraton_s: no selected case has this key (did you "
                               "mean min_duration_s?"), lines
    # The key next to the typo is still spread, and checked.
    assert lines[1] == f"error {suite}: overrides.*.timeout_s: Input should be greater than 0 (got 0)", lines


def test_findings_beyond_those_listed_are_counted(tmp_path: Path) -> None:
    from flagperf.errors import MAX_FINDINGS

    strays = "".join(f"  stray-{n:02}: {{m: 8}}\n" for n in range(MAX_FINDINGS + 5))
    suite = write(tmp_path / "s10.yaml", f"name: s10\ncases: [computation-FP32]\noverrides:\n{strays}")
    lines = errors("validate", str(suite))
    assert len(lines) == MAX_FINDINGS + 1, lines
    assert lines[0] == f"error {suite}: overrides.stray-00: is not one of the suite's cases"
    assert lines[-1] == f"error {suite}: ... and 5 more findings (not listed: fix these and check again)"
    assert len(errors("validate", str(write(tmp_path / "s11.yaml", "name: s11\ncases: [computation-FP32]\n"
                                             "overrides: {stray: {}}\n")))) == 1  # none left out: no such line


def test_gathered_counts_what_a_copy_left_out_once() -> None:
    """An error gathered twice (the overrides file read again with each scale file) had its copies' left_out added
    up: validate said "... and 15 more findings" where vendor check said "... and 5 more"."""
    from flagperf.errors import MAX_FINDINGS, gathered

    def cut() -> ConfigError:
        return gathered([ConfigError("a.yaml", f"k{index}", "unknown key") for index in range(MAX_FINDINGS + 5)])

    error = gathered([cut(), cut(), cut()])
    assert len(error.more) == MAX_FINDINGS - 1 and error.left_out == 5, error.left_out


def test_a_vendors_datasheets_yaml_is_checked_as_vendor_check_reads_it(tmp_path: Path) -> None:
    """datasheets.yaml (the shipped vendors' list of datasheet entries, read by their spec.py) was taken for a
    settings file by validate, and every shipped one refused ("top level must be a mapping, got list"). It is read
    as vendor check reads it, never by running spec.py: each entry names its source."""
    for vendor in ("nvidia", "amd"):
        result = runner.invoke(app, ["validate", str(PROJECT_ROOT / "vendor_images" / vendor / "datasheets.yaml")])
        assert result.exit_code == 0, result.output
        assert "(vendor datasheets)" in result.output
    acme = tmp_path / "acme"
    write(acme / "vendor.yaml", (PROJECT_ROOT / "vendor_images" / "nvidia" / "vendor.yaml").read_text())
    sheets = write(acme / "datasheets.yaml", "- names: [Acme X1]\n  bf16: 100\n- names: [Acme X2]\n  source: sheet\n")
    assert errors("validate", str(sheets)) == [
        f"error {display_path(sheets)}: entry 0: no source (where each figure comes from)"]
    write(sheets, "names: [Acme X1]\nsource: sheet\n")
    assert errors("validate", str(sheets)) == [
        f"error {display_path(sheets)}: top level must be a list of datasheet entries, got dict"]
    # Empty, or comments only, it passed: the shipped spec.py stops on it (list(None)), a vendor's finds no figure.
    for text in ("", "# Acme X1: to come\n", "[]\n"):
        write(sheets, text)
        assert errors("validate", str(sheets)) == [
            f"error {display_path(sheets)}: lists no datasheet entries (empty, or comments only): a list of entries, "
            "each with its source; or remove the file if the vendor's spec.py reads none"], text


def test_a_dockerfile_or_install_script_without_its_vendor_folder_says_it_is_checked_with_it(tmp_path: Path) -> None:
    """validate of a Dockerfile or an install script with no vendor.yaml above it read the file as YAML: "top level
    must be a mapping, got str". It says now that such a file is checked with its vendor folder, and where there is
    one but the file is none of the Dockerfiles vendor check builds (Dockerfile.dev, post_install.sh beside none), which
    ones it builds and how this one would be."""
    dockerfile = write(tmp_path / "lone" / "Dockerfile", "FROM x\nRUN true\n")
    script = write(tmp_path / "lone" / "pytorch_install.sh", "true\n")
    assert errors("validate", str(dockerfile), str(script)) == [
        f"error {display_path(path)}: {kind} is checked with its vendor folder, and no folder above it has vendor.yaml:"
        " `flagperf vendor check <folder>` checks the folder once it has one"
        for path, kind in ((dockerfile, "a Dockerfile"), (script, "an install script"))]
    vendor = tmp_path / "testvendor"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "vendor_adaptation" / "vendors" / vendor.name,
                    vendor)
    stray = write(vendor / "docker_image" / "pytorch" / "Dockerfile", "FROM x\nRUN true\n")
    dev = write(vendor / "pytorch" / "Dockerfile.dev", "FROM x\nRUN true\n")
    post = write(vendor / "docker_image" / "post_install.sh", "true\n")
    built = (f"vendor check builds {display_path(vendor)}'s container.dockerfile (pytorch/Dockerfile) and each "
             "<framework>/Dockerfile")
    assert errors("validate", str(stray), str(dev), str(post)) == [
        *(f"error {display_path(path)}: not a Dockerfile {built}: if it is the vendor's image, point "
          "container.dockerfile at it" for path in (stray, dev)),
        f"error {display_path(post)}: an install script beside none of the Dockerfiles {built}: put it beside the "
        "Dockerfile that runs it, or point container.dockerfile at the Dockerfile beside it"]
    # A file whose name only has "dockerfile" in it is no Dockerfile: read as the YAML it is, it is no such error.
    listing = write(vendor / "dockerfiles.yaml", "a: 1\n")
    assert not [line for line in errors("validate", str(listing)) if "Dockerfile" in line]

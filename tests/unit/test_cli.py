"""flows.cli through typer's CliRunner: `validate`, `list`, and `run` stopping at validation (no Prefect)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flagperf.config import night
from flagperf.errors import MAX_LINE, one_line
from flagperf.paths import PROJECT_ROOT, display_path
from flows.cli import app, vendor_app

runner = CliRunner()

REAL_CONFIG_FILES = sorted(
    [*PROJECT_ROOT.glob("cases/*/*/case.yaml"), *PROJECT_ROOT.glob("cases/*/*/vendor/*.yaml"),
     *PROJECT_ROOT.glob("deployments/suites/*.yaml"), *PROJECT_ROOT.glob("vendor_images/*/vendor.yaml"),
     *PROJECT_ROOT.glob("vendor_images/*/*/*/engine.yaml"),
     *PROJECT_ROOT.glob("vendor_images/*/toolkits/*/toolkit.yaml")]
)


def invoke(*args: str):
    return runner.invoke(app, list(args))


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error")]


def assert_clean_failure(result, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)


def test_real_config_files_are_found() -> None:
    names = {p.relative_to(PROJECT_ROOT).as_posix() for p in REAL_CONFIG_FILES}
    assert "deployments/suites/smoke.yaml" in names
    assert "vendor_images/cpu/vendor.yaml" in names
    assert "cases/base/computation-FP32/vendor/cpu.yaml" in names
    # 16 base specs + 4 training + 4 generate + 10 operation groups
    assert len([n for n in names if n.endswith("/case.yaml")]) == 35


def test_validate_every_real_config_file() -> None:
    result = invoke("validate", *map(str, REAL_CONFIG_FILES))
    assert result.exit_code == 0, result.output
    ok_lines = [line for line in result.output.splitlines() if line.startswith("ok")]
    assert len(ok_lines) == len(REAL_CONFIG_FILES)
    assert "(suite)" in result.output and "(vendor)" in result.output and "(case)" in result.output
    assert "(vendor overrides of computation-FP32)" in result.output
    # every family's engines and the toolkits, each by its own manifest
    assert "(inference engine onnxruntime of vendor cpu)" in result.output
    assert "(generate engine vllm-serve of vendor nvidia)" in result.output
    assert "(operation engine flaggems of vendor nvidia)" in result.output
    assert "(toolkit cublaslt_gemm of vendor nvidia, provides gemm)" in result.output


def test_validate_of_a_file_that_is_not_there_says_so(tmp_path: Path) -> None:
    """Named by where it would be read from (a vendor's overrides of a case): not there is not 'ok'."""
    for missing in (PROJECT_ROOT / "cases/base/computation-FP8/vendor/cpu.yaml",
                    PROJECT_ROOT / "cases/inference/digits-infer/vendor/zz_configurations.yaml", tmp_path / "x.yaml"):
        result = invoke("validate", str(missing))
        assert_clean_failure(result)
        assert error_lines(result.output) == [f"error {display_path(missing)}: file not found"], result.output


def test_validate_and_list_do_not_need_the_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # importing it now raises ImportError
    assert invoke("validate", str(PROJECT_ROOT / "deployments/suites/smoke.yaml")).exit_code == 0
    assert invoke("list").exit_code == 0


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("dup.yaml", "name: x\nname: y\n", "line 2: invalid YAML: duplicate key 'name'"),
        ("broken.yaml", "a: [1\n", "invalid YAML"),
        ("list.yaml", "- 1\n", "top level must be a mapping"),
        ("other.yaml", "a: 1\n", "vendor.yaml, engine.yaml, toolkit.yaml, suite, inventory or host.yaml file"),
        ("mine.yaml", "name: notmine\ncases: [computation-FP32]\n", "name: must match the file name"),
        ("suite0.yaml", "name: suite0\ncases: [computation-FP32]\nrounds: 0\n", "rounds"),
    ],
)
def test_validate_bad_file(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = invoke("validate", str(path))
    assert_clean_failure(result)
    lines = error_lines(result.output)
    assert len(lines) == 1, result.output
    assert str(path) in lines[0]
    assert expected in lines[0]


def test_validate_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    result = invoke("validate", str(path))
    assert_clean_failure(result)
    assert error_lines(result.output) == [f"error {path}: file not found"]


def test_validate_reports_every_bad_file_and_the_good_ones(tmp_path: Path) -> None:
    bad1, bad2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bad1.write_text("x: 1\nx: 2\n", encoding="utf-8")
    bad2.write_text("[", encoding="utf-8")
    good = PROJECT_ROOT / "vendor_images/cpu/vendor.yaml"
    result = invoke("validate", str(bad1), str(good), str(bad2))
    assert_clean_failure(result)
    assert len(error_lines(result.output)) == 2
    assert f"ok    {good} (vendor)" in result.output


def test_validate_vendor_override_equal_to_default(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", vendor="size: 8\n")
    vendor_file = folder / "vendor" / "cpu.yaml"
    result = invoke("validate", str(vendor_file))
    assert_clean_failure(result)
    assert error_lines(result.output) == [
        f"error {vendor_file}: size: overrides the default with the same value (8); remove the line"]


def test_a_long_path_loses_its_middle_never_the_advice(tmp_path: Path, make_case) -> None:
    """A line too long for one line (a lab's deep path) is shortened in the path, not at the end, where the
    message says what to do."""
    import shutil

    deep = tmp_path / ("lab-folder-" * 20) / ("configs-" * 25) / ("x" * 200) / "base" / "mycase"
    shutil.copytree(make_case("mycase", vendor="size: 8\n"), deep)
    result = invoke("validate", str(deep / "vendor" / "cpu.yaml"))
    assert_clean_failure(result)
    [line] = error_lines(result.output)
    assert len(str(deep)) > 500 and len(line) <= 520
    assert line.startswith(f"error {str(tmp_path)[:20]}"), line
    assert line.endswith("/mycase/vendor/cpu.yaml: size: overrides the default with the same value (8); remove the "
                         "line"), line
    # Many short words (a long list in a message): the line's middle goes, its start and its end stay.
    from flagperf.errors import ConfigError

    said = str(ConfigError("lab.yaml", "hosts", " ".join(["h1,"] * 400) + " remove the duplicates"))
    assert len(said) <= 500 and said.startswith("lab.yaml: hosts: h1, ") and said.endswith(" remove the duplicates")


def test_validate_vendor_override_with_yml_suffix(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase")
    vendor_file = folder / "vendor" / "cpu.yml"
    vendor_file.parent.mkdir()
    vendor_file.write_text("size: [\n", encoding="utf-8")
    result = invoke("validate", str(vendor_file))
    assert_clean_failure(result)


def test_validate_case_yaml_with_bad_default(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", configurations={"size": -1, "timeout_s": 1, "max_retries": 0})
    result = invoke("validate", str(folder / "case.yaml"))
    assert_clean_failure(result)
    lines = error_lines(result.output)
    assert len(lines) == 1 and f"{folder / 'case.yaml'}: configurations.size:" in lines[0]


def test_validate_vendor_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "acme"
    folder.mkdir()
    (folder / "vendor.yaml").write_text("name: acme\ndescription: d\ntorch_device: cpu\nshares_host_memory: true\n"
                                        "container:\n"
                                        "  dockerfile: Dockerfile\n  privileged: true\n", encoding="utf-8")
    (folder / "spec.py").write_text("", encoding="utf-8")
    (folder / "Dockerfile").write_text("", encoding="utf-8")
    result = invoke("validate", str(folder / "vendor.yaml"))
    assert_clean_failure(result)
    assert "privileged_reason" in error_lines(result.output)[0]


def test_validate_error_keeps_brackets_in_file_names(tmp_path: Path) -> None:
    path = tmp_path / "run[b]" / "x.yaml"
    result = invoke("validate", str(path))
    assert_clean_failure(result)
    assert str(path) in result.output


def test_run_error_with_closing_tag_in_message() -> None:
    result = invoke("run", "--cases", "computation-FP32", "--set", "a[/b]=1")
    assert_clean_failure(result)


def test_validate_case_whose_entry_does_not_import(tmp_path: Path, make_case) -> None:
    folder = make_case("mycase", bench="def run(:\n")
    result = invoke("validate", str(folder / "case.yaml"))
    assert_clean_failure(result)


def test_list_shows_every_case_vendor_and_suite() -> None:
    result = invoke("list")
    assert result.exit_code == 0, result.output
    for case in [p.parent.name for p in PROJECT_ROOT.glob("cases/*/*/case.yaml")]:
        assert case in result.output
    assert "cpu" in result.output
    assert "smoke" in result.output and "base" in result.output


def test_list_cases_includes_extra_case_root(make_case) -> None:
    make_case("zz-extra-case")
    result = invoke("list", "cases")
    assert result.exit_code == 0, result.output
    assert "zz-extra-case" in result.output
    assert "computation-FP32" in result.output
    assert "vendors" not in result.output


def test_list_unknown_kind() -> None:
    result = invoke("list", "widgets")
    assert_clean_failure(result)
    assert len(error_lines(result.output)) == 1


def test_list_with_a_broken_case(make_case) -> None:
    make_case("broken", manifest_extra={"family": "inference"})
    result = invoke("list", "cases")
    assert_clean_failure(result)
    assert "family" in error_lines(result.output)[0]


def test_run_unknown_case(tmp_path: Path) -> None:
    result = invoke("run", "--cases", "nope", "--results", str(tmp_path))
    assert_clean_failure(result)
    lines = error_lines(result.output)
    assert len(lines) == 1
    assert lines[0].startswith("error: --cases: unknown case 'nope' (")
    assert "`flagperf list cases` lists them" in lines[0]  # not a list cut off at the line's length
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rounds", "0"], "--rounds: must be between 1 and 100, got 0"),
        (["--rounds", "101"], "--rounds"),
        (["--cases", " , "], "--cases: no case names given"),
        (["--monitor-interval", "0"], "--monitor-interval"),
        (["--suite", "smoke", "--cases", "computation-FP32"], "not both"),
        (["--vendor", "acme"], "unknown vendor 'acme'"),
        (["--suite", "nope"], "unknown suite 'nope'"),
        (["--set", "m=abc", "--cases", "computation-FP32"], "--set: m: Input should be a valid integer"),
        (["--set", "m"], "--set: m: expected KEY=VALUE"),
        (["--set", "nokey=1"], "--set: nokey: no selected case has this key"),
        # A newcomer's typos: the nearest name is offered first.
        (["--cases", "computation-FP23"], "--cases: unknown case 'computation-FP23' (did you mean computation-FP32"),
        (["--cases", "computation-FP32", "--set", "min_duraton_s=2"], "did you mean min_duration_s"),
        (["--vendor", "nvidai"], "unknown vendor 'nvidai' (did you mean nvidia? known: "),
        (["--suite", "smok"], "unknown suite 'smok' (did you mean smoke? known: "),
    ],
)
def test_run_bad_input_stops_before_prefect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                           expected: str) -> None:
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # reaching the flow would be an ImportError
    result = invoke("run", "--results", str(tmp_path), *args)
    assert_clean_failure(result)
    lines = error_lines(result.output)
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_shows_help() -> None:
    result = invoke()
    assert "run" in result.output and "validate" in result.output and "list" in result.output


def test_the_command_lists_say_each_command_in_one_paragraph() -> None:
    """Wide enough for every description, each command of `flagperf --help` and `flagperf vendor --help` takes one
    line: the docstring's source wrap never breaks a description mid-sentence (typer's rich mode kept it)."""
    for args in ([], ["vendor"]):
        result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "600"}, terminal_width=600)
        assert result.exit_code == 0, result.output
        panel = [line.strip("│ ") for line in result.output.split("Commands")[1].splitlines() if line.startswith("│")]
        # each line: a command's name, then its description (a continuation line would start with a word of it)
        names = [line.split()[0] for line in panel]
        assert len(panel) >= 2 and all(len(line.split()) > 4 for line in panel), result.output
        group = vendor_app if args else app
        commands = [c.name or c.callback.__name__ for c in group.registered_commands]
        assert names == commands + [g.name for g in group.registered_groups], names


def test_run_help_names_the_planners_default_suite() -> None:
    """The help is written out (made without importing the planner): it must say the planner's default."""
    from flagperf.config.plan import DEFAULT_SUITE

    result = invoke("run", "--help")
    assert result.exit_code == 0, result.output
    assert f"(default: {DEFAULT_SUITE})" in " ".join(result.output.replace("│", " ").split())


# What the commands below never use: reports (pandas, numpy, Markdown), SSH hosts (paramiko), flows (Prefect).
NOT_AT_START = ("pandas", "numpy", "markdown", "paramiko", "prefect", "torch")


def test_help_list_and_validate_do_not_import_what_they_do_not_use() -> None:
    """`flagperf --help`, `list` and `validate` of files that name no case code, each in a fresh Python (where
    nothing else imported them first): none of the heavy packages the other commands need is imported (each
    command imports its own; bench/cli_startup.py measures what that saves)."""
    script = textwrap.dedent(f"""
        import json, sys
        from flows.cli import app
        try:
            app(sys.argv[1:], prog_name="flagperf")
        except SystemExit as exc:
            code = exc.code
        print(json.dumps([code, [name for name in {NOT_AT_START!r} if name in sys.modules]]))
    """)
    # A suite and a case.yaml name the project's kernels and family configs, whose modules are imported for their
    # Config: those import torch where they run, not with the module.
    for args in (["--help"], ["list"], ["validate", "vendor_images/cpu/vendor.yaml",
                                        "deployments/inventories/example.yaml", *PLUGIN_MANIFESTS],
                 ["validate", *KERNELS_VALIDATED]):
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
        code, imported = json.loads(done.stdout.splitlines()[-1])
        assert code in (0, None) and imported == [], (args, code, imported, done.stderr[-2000:])


# A plug-in manifest of each kind (an engine of each family, a toolkit): checked by the family's model, its module
# found by its file, never imported (the operation family's implementations and flaggems need torch).
PLUGIN_MANIFESTS = ["vendor_images/nvidia/operation/flaggems/engine.yaml",
                    "vendor_images/cpu/operation/native/engine.yaml", "vendor_images/nvidia/generate/vllm/engine.yaml",
                    "vendor_images/cpu/engines/inductor/engine.yaml",
                    "vendor_images/nvidia/toolkits/cublaslt_gemm/toolkit.yaml"]


def test_validate_checks_an_engine_or_toolkit_manifest_strictly_and_runs_nothing(tmp_path: Path) -> None:
    """`flagperf validate` of a vendor's engine.yaml or toolkit.yaml checks it as a run does, by the family's model
    (its engine folder says which) or the toolkit model: every finding its own line naming the file and key, an
    unknown key and a wrong type included; a file: or source outside the folder, a module that is none; a manifest
    in no folder a run reads it from. Nothing is imported, built or run: the engine's file would write a mark."""
    vendor = tmp_path / "acme"
    engine = vendor / "generate" / "fast"
    engine.mkdir(parents=True)
    (vendor / "vendor.yaml").write_text("name: acme\n", encoding="utf-8")  # its own folder: toolkits are read there
    mark = tmp_path / "imported"
    (engine / "engine.py").write_text(f"open({str(mark)!r}, 'w').close()\n", encoding="utf-8")
    manifest = engine / "engine.yaml"
    manifest.write_text("name: fast\ndescription: mine\nfile: engine.py\noptions: [batch]\n", encoding="utf-8")
    result = invoke("validate", str(manifest))
    assert result.exit_code == 0 and f"ok    {manifest} (generate engine fast of vendor acme)" in result.output, \
        result.output
    assert not mark.exists()

    def findings(text: str, path: Path = manifest) -> list[str]:
        path.write_text(text, encoding="utf-8")
        result = invoke("validate", str(path))
        assert_clean_failure(result)
        return error_lines(result.output)

    assert findings("name: 5\ndescripton: mine\nfile: engine.py\noptions: batch\n") == [
        f"error {manifest}: name: Input should be a valid string (got 5)",
        f"error {manifest}: options: Input should be a valid list (got 'batch')",
        f"error {manifest}: descripton: unknown key (did you mean description?)"]
    assert findings("name: other\ndescription: mine\nfile: engine.py\n") == [
        f"error {manifest}: name: must match the folder name ('fast')"]
    assert findings("name: fast\ndescription: mine\nmodule: os\n") == [
        f"error {manifest}: module: must be a shared engine under flagperf.generate. (got 'os')"]
    assert findings("name: fast\ndescription: mine\nmodule: flagperf.generate.no_such\n") == [
        f"error {manifest}: module: no module named 'flagperf.generate.no_such'"]
    (tmp_path / "outside.py").write_text("x = 1\n", encoding="utf-8")
    [line] = findings("name: fast\ndescription: mine\nfile: ../../../outside.py\n")
    assert line.startswith(f"error {manifest}: file: ") and "outside" in line, line
    elsewhere = vendor / "engins" / "fast" / "engine.yaml"  # a misspelt family folder: never read
    elsewhere.parent.mkdir(parents=True)
    [line] = findings("name: fast\ndescription: mine\nfile: engine.py\n", elsewhere)
    assert line.startswith(f"error {elsewhere}: never read: ") and "(this one is in 'engins')" in line, line
    assert not mark.exists()

    toolkit = vendor / "toolkits" / "fastgemm" / "toolkit.yaml"
    toolkit.parent.mkdir(parents=True)
    (toolkit.parent / "gemm.c").write_text("int main(void) { return 0; }\n", encoding="utf-8")
    assert findings("name: ../fastgemm\nprovides: gemmm\ndescription: x\nsources: [gemm.c, ../../../outside.py]\n"
                    "build: []\nprecisions: {bf16: bf16, bf61: x}\nrequire: [cc]\n", toolkit) == [
        f"error {toolkit}: name: toolkit name '../fastgemm' must start with a letter or digit and use only letters, "
        "digits, '_', '.', '-'",
        f"error {toolkit}: provides: 'gemmm' is asked for by no toolkit case (they ask for gemm)",
        f"error {toolkit}: build: List should have at least 1 item after validation, not 0 (got [])",
        f"error {toolkit}: precisions: 'bf61': no toolkit case runs such a precision (they run bf16, fp16, int8, "
        "fp8) (got {'bf16': 'bf16', 'bf61': 'x'})",
        f"error {toolkit}: require: unknown key (did you mean requires?)"]
    [line] = findings("name: fastgemm\nprovides: gemm\ndescription: x\nsources: [../../../outside.py]\n"
                      "build: [cc, gemm.c, -o, '{binary}']\nprecisions: {bf16: bf16}\n", toolkit)
    assert line.startswith(f"error {toolkit}: sources.0: ") and "outside the toolkit folder" in line, line
    toolkit.write_text("name: fastgemm\nprovides: gemm\ndescription: x\nsources: [gemm.c]\n"
                       "build: [cc, gemm.c, -o, '{binary}']\nprecisions: {bf16: bf16}\n", encoding="utf-8")
    result = invoke("validate", str(toolkit))
    assert result.exit_code == 0 and "(toolkit fastgemm of vendor acme, provides gemm)" in result.output, \
        result.output
    assert not list(toolkit.parent.glob("fastgemm*")) and not mark.exists()  # nothing built


def test_validate_s_ok_line_stays_one_line_however_long_its_path(tmp_path: Path) -> None:
    """Piped output (CliRunner's, grep's, a CI log's) has no terminal width: the console's 160 columns wrapped a
    long path's ok line onto two lines, which a script reading one line per file misreads."""
    path = tmp_path / ("d" * 160) / "inventory.yaml"
    path.parent.mkdir()
    path.write_text("hosts: [{name: a, address: localhost}]\n", encoding="utf-8")
    result = invoke("validate", str(path))
    assert result.exit_code == 0 and f"ok    {path} (inventory, 1 host(s))" in result.output.splitlines(), \
        result.output


def test_validate_says_never_read_of_a_plugin_manifest_no_run_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run reads a vendor from the first folder of its name with a vendor.yaml, engines also from later folders of
    the name without one, and toolkits only from its own folder: `validate` of an engine.yaml or a toolkit.yaml in a
    later copy with its own vendor.yaml (shadowed), or of a toolkit.yaml in a folder without one, says it is never
    read, where it said ok; an engine in a folder without vendor.yaml is read, and passes."""
    first, second, third = (tmp_path / name / "acme" for name in ("first", "second", "third"))
    toolkit_text = ("name: fastgemm\nprovides: gemm\ndescription: x\nsources: [gemm.c]\n"
                    "build: [cc, gemm.c, -o, '{binary}']\nprecisions: {bf16: bf16}\n")
    for vendor in (first, second, third):
        (vendor / "generate" / "fast").mkdir(parents=True)
        (vendor / "generate" / "fast" / "engine.py").write_text("x = 1\n", encoding="utf-8")
        (vendor / "generate" / "fast" / "engine.yaml").write_text("name: fast\ndescription: mine\nfile: engine.py\n",
                                                                  encoding="utf-8")
        (vendor / "toolkits" / "fastgemm").mkdir(parents=True)
        (vendor / "toolkits" / "fastgemm" / "gemm.c").write_text("int main(void) { return 0; }\n")
        (vendor / "toolkits" / "fastgemm" / "toolkit.yaml").write_text(toolkit_text, encoding="utf-8")
    for vendor in (first, second):
        (vendor / "vendor.yaml").write_text("name: acme\n", encoding="utf-8")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", ":".join(str(v.parent) for v in (first, second, third)))
    for path in (first / "generate" / "fast" / "engine.yaml", first / "toolkits" / "fastgemm" / "toolkit.yaml",
                 third / "generate" / "fast" / "engine.yaml"):
        result = invoke("validate", str(path))
        assert result.exit_code == 0 and f"ok    {path}" in result.output, result.output
    for path in (second / "generate" / "fast" / "engine.yaml", second / "toolkits" / "fastgemm" / "toolkit.yaml"):
        result = invoke("validate", str(path))
        assert_clean_failure(result)
        [line] = error_lines(result.output)
        # A long line (four paths) is shown as every error is (one_line: at most MAX_LINE, the middles of long paths
        # cut where the temporary folder is deep), never losing the file named nor the advice, whose paths stay whole
        # (copyable) and say which folder a run reads.
        advice = f"list {second.parent} before {first.parent} on FLAGPERF_VENDOR_PATH, or rename this vendor"
        assert line == "error " + one_line(
            f"never read: shadowed by {first}: --vendor acme reads the first folder of the name (vendor_images/, then "
            f"FLAGPERF_VENDOR_PATH in order), nothing of this one; {advice}", lead=f"{path}:"), line
        assert line.startswith(f"error {path}: never read: shadowed by ") and line.endswith(f"; {advice}"), line
        assert len(line) <= len("error ") + MAX_LINE, line
    path = third / "toolkits" / "fastgemm" / "toolkit.yaml"
    result = invoke("validate", str(path))
    assert_clean_failure(result)
    assert error_lines(result.output) == [
        f"error {path}: never read: a run reads toolkits from its vendor's own folder, the first of the name with a "
        f"vendor.yaml; {third} has none (a folder without one only adds engines): move the toolkit there"], \
        result.output


# Every suite of the project (base-spec kernels, operation), case.yaml files of the kernels' and drivers' families,
# and every training and inference case's (whose code takes its config base and data path type from
# flagperf.training.config, not from the driver or the data loaders, which import torch).
KERNELS_VALIDATED = ["deployments/suites/smoke.yaml", "deployments/suites/base.yaml",
                     "deployments/suites/operation.yaml", "cases/base/computation-FP8/case.yaml",
                     "cases/base/interconnect-MPI_intraserver/case.yaml", "cases/generate/tiny-llama-serve/case.yaml",
                     *sorted(str(p.relative_to(PROJECT_ROOT)) for p in [
                         *PROJECT_ROOT.glob("cases/training/*/case.yaml"),
                         *PROJECT_ROOT.glob("cases/inference/*/configurations.yaml")])]


def test_validate_runs_where_torch_cannot_be_imported() -> None:
    """A controller without torch (or with a broken one) validates suites and case.yaml files of the kernels and of
    every family: each kernel and driver imports torch where it runs, not where its Config is read."""
    assert len(KERNELS_VALIDATED) == 6 + 4 + 5, KERNELS_VALIDATED
    script = ("import sys\nsys.modules['torch'] = None  # `import torch` raises ModuleNotFoundError\n"
              "from flows.cli import app\napp(sys.argv[1:], prog_name='flagperf')\n")
    done = subprocess.run([sys.executable, "-c", script, "validate", *KERNELS_VALIDATED], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["ok"] * len(KERNELS_VALIDATED), done.stdout


@pytest.mark.parametrize(("args", "header", "error"), [
    (["run", "--suite", "tiny", "--rounds", "1"], "[bold]run ", "interrupted before anything started"),
    (["nightly", "--suite", "tiny", "--rounds", "1"], "[bold]nightly ", "interrupted; the night is not judged"),
], ids=["run", "nightly"])
def test_ctrl_c_the_moment_the_header_shows_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        restored_process_state: None, args: list[str],
                                                        header: str, error: str) -> None:
    """A Ctrl-C delivered exactly as the header is printed (what a user sees first, so when they press it) stops
    the command with exit 130 and one error line, as one at any later moment does: never a silent exit (typer
    turns an unhandled KeyboardInterrupt into a bare 130)."""
    import os
    import signal

    from flows import cli

    monkeypatch.setenv("FLAGPERF_SUITE_PATH", str(PROJECT_ROOT / "tests" / "fixtures" / "suites"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    printed = cli.console.print

    def print_then_ctrl_c(*objects, **options) -> None:
        printed(*objects, **options)
        if objects and str(objects[0]).startswith(header):
            os.kill(os.getpid(), signal.SIGINT)  # handled here, in the main thread, before print returns

    monkeypatch.setattr(cli.console, "print", print_then_ctrl_c)
    result = invoke(*args, "--results", str(tmp_path / "results"))
    assert result.exit_code == 128 + signal.SIGINT, result.output
    assert error_lines(result.output) == [f"error: {error}"], result.output
    assert not list((tmp_path / "results").glob("run*"))


def _edges(bound) -> list[tuple[float, bool]]:
    """Values at and just beyond each end of a bound, with whether its definition admits them."""
    step = 1 if isinstance(bound.low, int) and isinstance(bound.high, int) and not bound.above_low else 1e-6
    return [(bound.low - step, False), (bound.low, not bound.above_low), (bound.low + step, True),
            (bound.high, True), (bound.high + step, False)]


NIGHT_BOUNDS = ["rounds", "baseline_runs", "sigma"]


@pytest.mark.parametrize("name", NIGHT_BOUNDS)
def test_the_nightly_cli_and_flow_refuse_the_same_numbers(name: str) -> None:
    """One definition (flagperf.config.night): the CLI's check before prefect and the flow's own parameter
    validation (a deployment's form) admit exactly the values it admits, at both ends."""
    from prefect.exceptions import ParameterTypeError

    from flagperf.errors import ConfigError
    from flows.nightly import nightly_regression
    from flows.nightly_cli import check_bounds

    good = {"rounds": 3, "baseline_runs": 5, "sigma": 3.0}
    for value, admitted in _edges(getattr(night, name.upper())):
        try:
            check_bounds(**{**good, name: value})
            cli_admits = True
        except ConfigError as exc:
            assert exc.source == f"--{name.replace('_', '-')}", exc
            cli_admits = False
        try:
            nightly_regression.validate_parameters({name: value})
            flow_admits = True
        except ParameterTypeError:
            flow_admits = False
        assert (cli_admits, flow_admits) == (admitted, admitted), (name, value)


OUT_OF_RANGE = [(name, value) for name in NIGHT_BOUNDS
                for value, admitted in _edges(getattr(night, name.upper())) if not admitted]


@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE)
def test_nightly_refuses_out_of_range_numbers_before_prefect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             name: str, value: float) -> None:
    """Each value just beyond a bound: one line naming the option, exit 2, nothing made, prefect never loaded."""
    for module in ("prefect", "flows.nightly", "flows.evaluate", "flows.server"):
        monkeypatch.setitem(sys.modules, module, None)  # reaching any of them would be an ImportError
    option = f"--{name.replace('_', '-')}"
    result = invoke("nightly", option, str(value), "--results", str(tmp_path / "results"))
    assert_clean_failure(result)
    assert [line.split(":")[1].strip() for line in error_lines(result.output)] == [option], result.output
    assert not (tmp_path / "results").exists()


def test_a_retry_whose_case_is_not_on_the_search_path_says_which_run_case_and_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bench_py: str, yaml_writer, restored_process_state: None
) -> None:
    """`flagperf run --retry` from another folder, where a relative FLAGPERF_CASE_PATH entry names no copy of the
    run's case: one line naming the run's plan, the run, the case, the folders looked in and the run's own."""
    from flagperf.config.plan import PLAN_FILE, plan_run

    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # refused before the flow
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    folder = start / "my-cases" / "base" / "own-case"
    yaml_writer(folder / "case.yaml", {"name": "own-case", "family": "base", "description": "a lab's own",
                                       "configurations": {"size": 8, "timeout_s": 60, "max_retries": 0}})
    (folder / "bench.py").write_text(bench_py, encoding="utf-8")
    elsewhere.mkdir()
    results = tmp_path / "results"
    monkeypatch.chdir(start)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", "my-cases")
    planned = plan_run(cases=["own-case"], results_dir=results, run_id="run-a")
    (results / "run-a").mkdir(parents=True)
    (results / "run-a" / PLAN_FILE).write_text(planned.model_dump_json(), encoding="utf-8")

    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", "my-cases")
    result = invoke("run", "--cases", "own-case", "--retry", str(results / "run-a"))
    assert_clean_failure(result)
    assert error_lines(result.output) == [
        f"error: {results / 'run-a' / PLAN_FILE}: cases: run run-a's case base/own-case not found: looked in "
        f"{PROJECT_ROOT / 'cases'}, {elsewhere / 'my-cases'}; the run's FLAGPERF_CASE_PATH was {start / 'my-cases'}: "
        "retry with that, or from the folder the run was started in"], result.output


def test_a_run_id_that_is_taken_is_refused_naming_run_id_also_when_another_run_claims_it_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf run --run-id X`: a run folder that is there is refused in one line naming --run-id, before the flow.
    Two runs given one id at the same time both pass that check: the run folder is claimed (an exclusive mkdir)
    once the input is good, so the second, which finds it claimed, is refused the same way and leaves the first's
    folder as it is (both wrote into one folder)."""
    from flows import cli

    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # refused before the flow
    results = tmp_path / "results"
    (results / "mine").mkdir(parents=True)
    result = invoke("run", "--cases", "computation-FP32", "--results", str(results), "--run-id", "mine")
    assert_clean_failure(result)
    assert error_lines(result.output) == [f"error: --run-id: 'mine' is taken: {results / 'mine'} exists; results are "
                                          "never overwritten"], result.output

    made = cli._make_results_folder

    def another_run_claims_it_meanwhile(folder: Path, *where: str | None) -> Path | None:
        outermost = made(folder, *where)
        (folder / "same").mkdir()  # the other run, between this one's check and its claim
        (folder / "same" / "plan.json").write_text("{}", encoding="utf-8")
        return outermost

    monkeypatch.setattr(cli, "_make_results_folder", another_run_claims_it_meanwhile)
    fresh = tmp_path / "fresh"
    result = invoke("run", "--cases", "computation-FP32", "--results", str(fresh), "--run-id", "same")
    assert_clean_failure(result)
    assert error_lines(result.output) == [f"error: --run-id: 'same' is taken: {fresh / 'same'} exists; results are "
                                          "never overwritten"], result.output
    assert sorted(fresh.rglob("*")) == [fresh / "same", fresh / "same" / "plan.json"]  # the other run's, as it was

    own = "is a name the results folder gives its own files (history.sqlite and its journals, trends.csv, "
    for args, said in ((["--run-id", "../out"], "--run-id: '../out' is not a valid name"),
                       (["--run-id", "r" * 129], f"--run-id: {'r' * 40!r}... is too long: 129 characters, at most 128"),
                       *((["--run-id", name], f"--run-id: {name!r} {own}") for name in (
                           "history.sqlite", "history.sqlite-wal", "trends.csv", "nightly-smoke.json", "server")),
                       (["--run-id", "a", "--retry", str(results / "b")],
                        "--run-id a: a retry continues its run folder's id (b)")):
        result = invoke("run", "--cases", "computation-FP32", "--results", str(results), *args)
        assert_clean_failure(result)
        (line,) = error_lines(result.output)
        assert line.startswith(f"error: {said}"), line



def test_a_flow_run_that_cannot_be_made_is_said_without_the_urls_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_process_state: None) -> None:
    """The server refused to make the flow run (a wrong sign-in: 401): the line said the client's error whole, whose
    URL held the user and password of PREFECT_API_URL. Now its status alone: nothing of the URL reaches the console
    or a CI log."""
    import httpx

    from flows import evaluate

    url = "http://alice:s3cret-pw@127.0.0.1:9/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    request = httpx.Request("POST", f"{url}/flow_runs/")

    def refused(**_: object) -> None:
        raise httpx.HTTPStatusError(f"Client error '401 Unauthorized' for url '{request.url}'", request=request,
                                    response=httpx.Response(401, request=request))

    monkeypatch.setattr(evaluate, "evaluate", refused)
    result = invoke("run", "--cases", "computation-FP32", "--results", str(tmp_path / "results"))
    assert_clean_failure(result, 1)
    (line,) = error_lines(result.output)
    assert line == "error: the evaluation could not run: HTTPStatusError: 401 Unauthorized", result.output
    assert "s3cret" not in result.output


def test_a_run_that_fails_between_its_claim_and_its_flow_gives_its_run_folder_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restored_process_state: None) -> None:
    """The run folder is claimed once the input is good; what fails after that and before the run begins (here
    the live view's module cannot be imported) gives it back, and the results folder made for it: one line, and
    the same `--run-id` again is not refused as taken by an empty folder left behind."""
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)
    monkeypatch.setitem(sys.modules, "flows.progress", None)  # importing it now raises ImportError
    results = tmp_path / "nested" / "results"
    for _ in range(2):
        result = invoke("run", "--cases", "computation-FP32", "--results", str(results), "--run-id", "again")
        assert_clean_failure(result, 1)
        (line,) = error_lines(result.output)
        assert line.startswith("error: the evaluation could not run: ModuleNotFoundError: "), result.output
        assert not (tmp_path / "nested").exists()


@pytest.mark.parametrize("bad", ["https://perf-lab.example.org/ui", "https://perf-lab.example.org:99999",
                                 "https://lab:pw@perf-lab.example.org", "perf-lab.example.org", "https://:4200",
                                 # a traceback (urlsplit's ValueError) before; the rest were taken
                                 "http://[::1", "http://x:4200?q", "http://x:4200#f", "http://x\\y:4200",
                                 "http://[::1]x:80", "http://x:0", "http://999.1.2.3:4200", "ftp://x:4200",
                                 "http://x:4200//", "http://-x:4200", "http://[fe80::1%eth0]:4200"])
def test_every_public_url_is_checked_naming_the_option(tmp_path: Path, bad: str) -> None:
    """--public-url is repeatable (a TLS alias behind a proxy beside the first): each one is checked, not only the
    last, in one line naming the option, before anything starts."""
    logs = tmp_path / "logs"
    result = runner.invoke(app, ["server", "--database-url", "postgresql+asyncpg://lab@127.0.0.1:5432/none",
                                 "--public-url", bad, "--public-url", "http://perf-lab:4200", "--log-dir", str(logs)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (f"error: --public-url {bad}: give scheme, host and port only, "
                                                      "e.g. http://perf-lab:4200")
    assert not logs.exists()


@pytest.mark.parametrize("good", ["http://perf-lab:4200", "https://perf-lab.example.org/", "http://[::1]:4200",
                                  "http://10.1.2.3", "http://localhost.:4200", "HTTPS://Perf-Lab.Example.org:65535",
                                  "http://my_host:4200", "https://xn--bcher-kva.example"])
def test_a_public_url_of_scheme_host_and_port_passes_its_check(good: str) -> None:
    from flows.cli import _scheme_host_port

    assert _scheme_host_port(good)


def test_server_name_is_a_name_only(tmp_path: Path) -> None:
    """--server-name adds a Host the server answers to: a URL or anything with a path is one line, before anything
    starts (its logs folder is not made)."""
    logs = tmp_path / "logs"
    result = runner.invoke(app, ["server", "--database-url", "postgresql+asyncpg://lab@127.0.0.1:5432/none",
                                 "--server-name", "perf-lab", "--server-name", "http://evil.example/x",
                                 "--log-dir", str(logs)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == ("error: --server-name http://evil.example/x: give a host name or "
                                                      "address only, e.g. perf-lab.example.org")
    assert not logs.exists()


def test_a_retry_of_a_run_still_running_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flagperf run --retry RUN` of a run whose controller runs was refused only by the flow: after a temporary
    server started and the retry's log lines were added to the running run's controller.log. Refused first, in one
    line naming --retry and the controller; nothing written to the run folder."""
    import signal
    import socket

    from flagperf.config.plan import PLAN_FILE
    from tests.unit.controllers import controller

    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # refused before the flow
    run = tmp_path / "results" / "run-a"
    run.mkdir(parents=True)
    (run / PLAN_FILE).write_text("{}", encoding="utf-8")
    proc, _ = controller(run)
    try:
        before = sorted(path.name for path in run.iterdir())
        result = invoke("run", "--cases", "computation-FP32", "--retry", str(run))
        assert sorted(path.name for path in run.iterdir()) == before
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert_clean_failure(result)
    (line,) = error_lines(result.output)
    assert line.startswith(f"error: --retry: {run}: another controller is running this run (pid {proc.pid} on "
                           f"{socket.gethostname()}, since "), result.output

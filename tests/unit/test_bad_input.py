"""Bad input of every class the acceptance pass found, through the CLI as a user meets it: exit 2, one line
that names the file (or option) and the key, no traceback, nothing started. Run without Prefect."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mounts import mounted_tmpfs
from typer.testing import CliRunner

from flagperf.paths import PROJECT_ROOT
from flows.cli import app

runner = CliRunner()
HOST_YAML = "VENDOR: cpu\nHOSTS: [10.0.0.9]\nCASES: {computation-FP32: pytorch}\n"
BOMB = "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9 if p else ['x'] * 9)}]\n"
               for p, n in zip([None, "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi", strict=True))


@pytest.fixture(autouse=True)
def _no_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flows.evaluate", None)  # bad input must be refused before the flow


def fail(*args: str, key: str) -> str:
    """Run the CLI, expect exit 2 with one short error line containing ``key``; return that line."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and key in lines[0] and len(lines[0]) <= 520, result.output[:2000]
    assert "Traceback" not in result.output
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "key"), [
    (HOST_YAML.replace("cpu", "acme"), "VENDOR: unknown vendor 'acme'"),
    (HOST_YAML.replace("computation-FP32", "no-such-case"), "CASES.no-such-case: unknown case"),
    (HOST_YAML.replace("computation-FP32: pytorch", '"nosuchnet:pytorch_1.13": /data'),
     "CASES.nosuchnet:pytorch_1.13: no inference case"),
])
def test_host_yaml_names_are_checked_by_validate_and_run(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path / "host.yaml", text)
    assert str(path) in fail("validate", str(path), key=key)
    fail("run", "--host-config", str(path), key=key)


def test_inventory_vendor_is_checked_where_it_is_written(tmp_path: Path) -> None:
    path = write(tmp_path / "inv.yaml", "vendor: acme\nhosts: [{name: a}]\n")
    line = fail("validate", str(path), key="vendor: unknown vendor 'acme'")
    assert "--vendor" not in line
    fail("run", "--inventory", str(path), key="vendor: unknown vendor")


def test_types_are_not_coerced(tmp_path: Path) -> None:
    suite = write(tmp_path / "s.yaml", 'name: s\ndescription: x\ncases: [computation-FP32]\nrounds: "3"\n')
    fail("validate", str(suite), key="rounds")
    fail("run", "--suite", str(suite), key="rounds")
    inv = write(tmp_path / "inv.yaml", "hosts: [{name: a, connect_timeout_s: '10'}]\n")
    fail("validate", str(inv), key="hosts.0.connect_timeout_s")


def test_an_unknown_peak_is_refused(tmp_path: Path, make_case) -> None:
    manifest = make_case("odd-peak", manifest_extra={"peak": "fp99"}) / "case.yaml"
    line = fail("validate", str(manifest), key="unknown peak 'fp99'")
    assert "memory_side_cache" not in line  # a device fact is not offered as a peak


def test_a_device_fact_is_refused_as_a_peak(tmp_path: Path, make_case) -> None:
    """memory_side_cache is in the spec table beside the peaks: a cache's size would make no roofline."""
    manifest = make_case("cache-peak", manifest_extra={"peak": "memory_side_cache"}) / "case.yaml"
    line = fail("validate", str(manifest), key="peak")
    assert str(manifest) in line and "'memory_side_cache' is a device fact of the spec table, not a peak" in line


def test_an_alias_bomb_is_refused_quickly_without_echo(tmp_path: Path) -> None:
    suite = write(tmp_path / "bomb.yaml", BOMB + "cases: [computation-FP32]\n")
    line = fail("validate", str(suite), key="aliases expand to more than")
    assert "x" * 3 not in line and "'x'" not in line
    deep = write(tmp_path / "deep.yaml", "cases: " + "[" * 3000 + "]" * 3000 + "\n")
    fail("validate", str(deep), key="nested too deeply")


def test_a_value_in_an_error_line_is_bounded(tmp_path: Path) -> None:
    huge = "[" + ",\n  ".join(["[1, 2, 3, 4, 5, 6, 7, 8]"] * 2000) + "]"  # short lines: read, then refused
    suite = write(tmp_path / "s.yaml", f"name: s\ndescription: x\ncases: [computation-FP32]\nrounds: {huge}\n")
    line = fail("validate", str(suite), key="rounds")
    assert "..." in line


@pytest.mark.parametrize(("option", "words"), [
    ("-v /var/run/docker.sock:/var/run/docker.sock", "docker.sock"),
    ("-v /:/host", "'/'"),
    ("--device /dev/mem", "/dev/mem"),
    ("--device=/dev/sda", "/dev/sda"),
    ("-v ../etc:/x", "without '..'"),
    ("--ipc container:x", "--ipc"),
])
def test_container_mounts_and_devices_are_validated(tmp_path: Path, option: str, words: str) -> None:
    inv = write(tmp_path / "inv.yaml", f"hosts: [{{name: a, docker: {{extra_options: '{option}'}}}}]\n")
    assert words in fail("validate", str(inv), key="hosts.0.docker.extra_options")
    host_yaml = write(tmp_path / "host.yaml", HOST_YAML + f"ACCE_CONTAINER_OPT: '{option}'\n")
    fail("validate", str(host_yaml), key="ACCE_CONTAINER_OPT")


def test_a_data_mount_of_the_engine_socket_is_refused(tmp_path: Path) -> None:
    inv = write(tmp_path / "inv.yaml", "hosts: [{name: a, docker: {data_mounts: [/run/docker.sock]}}]\n")
    fail("validate", str(inv), key="hosts.0.docker.data_mounts")


def test_an_unset_environment_reference_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLAGPERF_TEST_UNSET", raising=False)
    inv = write(tmp_path / "inv.yaml", "hosts: [{name: a, env: {TOKEN: '${FLAGPERF_TEST_UNSET}'}}]\n")
    fail("validate", str(inv), key="hosts.0.env.TOKEN: refers to ${FLAGPERF_TEST_UNSET}")


def test_results_folder_that_cannot_be_written(tmp_path: Path) -> None:
    a_file = write(tmp_path / "a-file", "")
    fail("run", "--cases", "computation-FP32", "--results", str(a_file), key="--results")
    fail("run", "--cases", "computation-FP32", "--results", "/proc/flagperf/results", key="--results")
    host_yaml = write(tmp_path / "host.yaml", HOST_YAML + f"FLAGPERF_LOG_PATH: {a_file}\n")
    assert "is a file" in fail("run", "--host-config", str(host_yaml), key="FLAGPERF_LOG_PATH")


@pytest.mark.parametrize("value", ["lab one", "a=b", "x" * 129])
def test_a_container_owner_no_label_can_carry_is_refused_before_the_run(tmp_path: Path, value: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """FLAGPERF_CONTAINER_OWNER went into every container's label as it was: a space or '=' made a label no
    `docker ps --filter` finds by. It is now refused at plan time, one line naming the variable; nothing is made."""
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", value)
    results = tmp_path / "results"
    fail("run", "--cases", "computation-FP32", "--results", str(results), key="FLAGPERF_CONTAINER_OWNER: ")
    assert not results.exists()


@pytest.mark.parametrize("command", ["run", "nightly"])
def test_a_bad_container_owner_is_said_first_by_run_and_nightly(tmp_path: Path, command: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner value was checked by `run` only after the inventory and the local probe, and by `nightly` not at
    all (a night of probes and builds before the first round refused it). Now it is the first thing either says."""
    monkeypatch.setenv("FLAGPERF_CONTAINER_OWNER", "lab one")
    results = tmp_path / "results"
    missing = str(tmp_path / "no-inventory.yaml")  # an error of its own, said later than the owner
    args = ["--cases", "computation-FP32"] if command == "run" else ["--suite", "no-such-suite"]
    fail(command, *args, "--inventory", missing, "--results", str(results), key="FLAGPERF_CONTAINER_OWNER: ")
    assert not results.exists()


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
        yield folder


def test_results_on_a_read_only_file_system(read_only_folder: Path) -> None:
    line = fail("run", "--cases", "computation-FP32", "--results", str(read_only_folder / "r"), key="--results")
    assert "Read-only file system" in line


def test_a_history_url_with_a_password_is_refused() -> None:
    from flagperf.errors import ConfigError
    from flagperf.results.history import history_engine

    with pytest.raises(ConfigError, match="holds a password") as info:
        history_engine("postgresql+psycopg://flagperf:hunter2@127.0.0.1/flagperf")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["postgresql+psycopg://perf@127.0.0.1:abc/history",
                                 "postgresql+psycopg://perf:hunter2@127.0.0.1:abc/history"])
def test_a_history_url_whose_port_is_no_number_is_one_line(url: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """make_url raises ValueError (not ArgumentError) for a port that is no number: once a traceback in the
    nightly's check, diagnose --history and the site; now the bad URL's line, never its password."""
    from flagperf.errors import ConfigError
    from flagperf.results.history import check_history, history_reader, sqlite_files

    assert sqlite_files(url, tmp_path) == []
    for open_it in (check_history, history_reader):
        with pytest.raises(ConfigError, match=r"^history_url: not a database URL") as info:
            open_it(url, tmp_path)
        assert "hunter2" not in str(info.value)
    run = tmp_path / "run"
    shutil.copytree(HOSTILE / "fleet-diagnose-run-folder" / "good", run)
    monkeypatch.setenv("FLAGPERF_HISTORY_URL", url)
    assert "hunter2" not in fail("diagnose", str(run), "--history", key="not a database URL")


@pytest.mark.parametrize("value", ["*s3cret", "!s3cret x"])
def test_a_set_value_that_is_no_yaml_is_not_quoted(value: str) -> None:
    """YAML's problem text quotes the value (an alias' or a tag's name); a --set value (server_env.*) may be a
    secret: the line names the key and says what is wrong, with nothing of the value."""
    line = fail("run", "--cases", "main_memory-bandwidth", "--set", f"server_env.TOKEN={value}",
                key="--set: server_env.TOKEN: invalid YAML")
    assert "s3cret" not in line


def test_a_history_url_whose_port_is_out_of_range_is_refused_before_the_night(tmp_path: Path) -> None:
    """Port 99999 made no URL error, only a connection error after the night had measured: refused now."""
    from flagperf.errors import ConfigError
    from flagperf.results.history import check_history, history_reader

    for open_it in (check_history, history_reader):
        with pytest.raises(ConfigError, match=r"^history_url: port 99999 is out of range \(1-65535\)$"):
            open_it("postgresql+psycopg://perf@127.0.0.1:99999/history", tmp_path)


def test_aliases_load_up_to_the_bound() -> None:
    """The bound counts values as expanded: 9**5 leaves load (shared, not copied); 9**6 do not."""
    from flagperf.config.yamlio import MAX_EXPANDED_VALUES, parse_yaml_text
    from flagperf.errors import ConfigError

    five = "".join(BOMB.splitlines(keepends=True)[:5])
    assert 9 ** 5 < MAX_EXPANDED_VALUES < 9 ** 6
    data = parse_yaml_text(five, "five.yaml")
    assert len(data["e"]) == 9 and data["e"][0] is data["d"]
    with pytest.raises(ConfigError, match="aliases expand"):
        parse_yaml_text("".join(BOMB.splitlines(keepends=True)[:6]), "six.yaml")


HOSTILE = Path(__file__).resolve().parents[1] / "fixtures" / "hostile"  # format: its README.md


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under folder with its kind and content (links by target); nothing but regular files is opened."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):  # links to folders are listed, not followed
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                kind = f"link -> {os.readlink(path)}"
            elif stat.S_ISREG(mode):
                kind = "file " + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                kind = stat.filemode(mode)[0]
            found[str(path.relative_to(folder))] = kind
    return found


def _make(copy: Path, items: list[dict[str, Any]]) -> None:
    for item in items:
        (what, rel), *rest = item.items()
        path = copy / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if what == "symlink":
            path.symlink_to(dict(rest)["to"])
        elif what == "fifo":
            os.mkfifo(path)
        elif what == "dir":
            path.mkdir()
        elif what == "copy":  # a file shared by many inputs, from tests/fixtures (e.g. a case's module)
            source = (HOSTILE.parent / dict(rest)["from"]).resolve()
            assert source.is_relative_to(HOSTILE.parent.resolve()) and source.is_file(), source
            shutil.copyfile(source, path)
        elif what == "write":
            with path.open("w", encoding="utf-8") as out:
                for text, times in dict(rest)["parts"]:
                    out.write(text * times)
        else:
            raise AssertionError(f"expect.yaml: make: unknown item {what!r}")


def _as_list(value: str | list[str] | None) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


@pytest.mark.parametrize("name", sorted(p.parent.name for p in HOSTILE.glob("*/expect.yaml")))
def test_hostile_input(name: str, tmp_path: Path) -> None:
    """One folder of tests/fixtures/hostile through the real CLI; the checks are those of its README."""
    expect = yaml.safe_load((HOSTILE / name / "expect.yaml").read_text(encoding="utf-8"))
    copy = tmp_path / name
    shutil.copytree(HOSTILE / name, copy, symlinks=True)
    (copy / "expect.yaml").unlink()
    _make(copy, expect.get("make") or [])
    before = _snapshot(copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
           "FLAGPERF_CASE_PATH": str(copy / "cases"), "FLAGPERF_SUITE_PATH": str(copy / "suites"),
           "FLAGPERF_VENDOR_PATH": str(copy / "vendor_images"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_API_URL": "http://127.0.0.1:1/api"}  # a run wrongly accepted fails fast, starts no server
    for run in expect["runs"]:
        args = [str(a) for a in run["args"]]
        try:
            done = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=copy, env=env,
                                  capture_output=True, text=True, timeout=expect.get("timeout_s", 300),
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: flagperf {' '.join(args)} did not finish in {expect.get('timeout_s', 300)} s")
        said = f"{name}: flagperf {' '.join(args)}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
        assert done.returncode == run.get("exit", 2), said
        assert "Traceback" not in done.stdout + done.stderr, said
        errors = done.stderr.splitlines()
        if done.returncode == 2:
            assert len(errors) == 1, said
            for part in _as_list(run.get("error")):
                assert part in errors[0], f"{part!r} not in the error line; {said}"
        else:
            assert errors == [], said
        for part in _as_list(run.get("out")):
            assert part in done.stdout, f"{part!r} not in stdout; {said}"
        for part in _as_list(expect.get("absent")):
            assert part not in done.stdout + done.stderr, f"{part!r} (a secret) was printed; {said}"
        after = _snapshot(copy)
        assert after == before, f"{said}\nleft behind or changed: " + ", ".join(
            sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k)))


def test_the_marker_of_the_hostile_case_modules_is_live(tmp_path: Path) -> None:
    """The hostile inputs' case code does write its marker when imported: their 'nothing left behind' check can
    fail (what `flagperf run` does with a case's module is what validate must not do)."""
    from flagperf.config.vendors import import_file

    module = tmp_path / "bench.py"
    shutil.copy(HOSTILE / "case-code-runs-at-import" / "cases" / "base" / "side-effect" / "bench.py", module)
    import_file(module, "flagperf_test_hostile_marker")
    sys.modules.pop("flagperf_test_hostile_marker", None)
    assert (tmp_path / "executed").is_file()


MARKER = "from pathlib import Path\nPath(__file__).with_name('executed').write_text('x')\n"


@pytest.mark.parametrize(("bench", "key"), [
    ("def run(config, ctx):\n    return []\n", "bench.py has no 'Config'"),
    ("from flagperf.measure.casekit import CaseConfig\nclass Config(CaseConfig):\n    size: int\n", "has no 'run'"),
    ("from pydantic import BaseModel\nclass Config(BaseModel):\n    size: int\ndef run(c, x):\n    return []\n",
     "must subclass flagperf.measure.casekit.CaseConfig"),
    ("from helpers import Base\nclass Config(Base):\n    size: int\ndef run(c, x):\n    return []\n",
     "cannot be checked without running the case"),
    ("def run(config, ctx:\n    return []\n", "invalid Python"),
    ("from flagperf.measure.casekit import CaseConfig\nclass Config(CaseConfig):\n    size: int\n"
     "    colour: str\ndef run(c, x):\n    return []\n", "colour: required key is missing"),
])
def test_validate_reads_a_case_module_without_running_it(make_case, bench: str, key: str) -> None:
    folder = make_case("static", bench=MARKER + bench, configurations={"size": 8, "timeout_s": 60, "max_retries": 0})
    fail("validate", str(folder / "case.yaml"), key=key)
    assert not (folder / "executed").exists()


def test_validate_types_a_case_config_from_its_source(make_case) -> None:
    """Annotations and Field(...) made of literals and the core's names are checked as the case's Config would."""
    bench = MARKER + (
        "from typing import Literal\nfrom pydantic import Field\nfrom flagperf.measure.casekit import CaseConfig\n"
        "LIMIT = 2 ** 4\nclass Config(CaseConfig):\n    size: int = Field(gt=0, le=LIMIT + 1)\n"
        "    mode: Literal['a', 'b'] = 'a'\n    tags: list[str] = Field(default_factory=list)\n"
        "def run(c, x):\n    return []\n")
    good = {"size": 17, "mode": "b", "tags": ["x"], "timeout_s": 60, "max_retries": 0}
    folder = make_case("typed", bench=bench, configurations=good)
    assert runner.invoke(app, ["validate", str(folder / "case.yaml")]).exit_code == 0
    for name, (key, value) in enumerate([("size", 18), ("mode", "c"), ("tags", "x"), ("size", "8")]):
        folder = make_case(f"typed{name}", bench=bench, configurations={**good, key: value})
        fail("validate", str(folder / "case.yaml"), key=key)
        assert not (folder / "executed").exists()


def test_a_long_string_is_refused_by_its_key(tmp_path: Path) -> None:
    folded = "\n".join(["  " + "y" * 100] * 50)  # 5000 characters over short lines: parsed, then bounded
    suite = write(tmp_path / "s.yaml", f"name: s\ndescription: >-\n{folded}\ncases: [computation-FP32]\n")
    assert "at most 4096" in fail("validate", str(suite), key="description")
    inv = write(tmp_path / "inv.yaml", "hosts: [{name: a, env: {TOKEN: '" + "z" * 5000 + "'}}]\n")
    fail("validate", str(inv), key="hosts.0.env.TOKEN")


@pytest.mark.parametrize("link", ["source", "folder"])
def test_a_toolkit_that_leads_out_of_the_vendor_folder_is_refused(tmp_path: Path, link: str) -> None:
    from flagperf.basespec.toolkit import find_toolkit
    from flagperf.errors import ConfigError

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "prog.py").write_text("print('built from outside')\n", encoding="utf-8")
    toolkits = tmp_path / "vendor" / "toolkits"
    folder = (outside if link == "folder" else toolkits / "t")
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "toolkit.yaml", "name: t\nprovides: gemm\ndescription: x\nsources: [prog.py]\n"
                                   "build: [cp, prog.py, '{binary}']\nprecisions: {bf16: bf16}\n")
    if link == "folder":
        toolkits.mkdir(parents=True)
        (toolkits / "t").symlink_to(outside)
        expected = "is outside the vendor folder"
    else:
        (folder / "prog.py").symlink_to(outside / "prog.py")
        expected = "sources.0: 'prog.py' is outside the toolkit folder"
    with pytest.raises(ConfigError, match=expected):
        find_toolkit(tmp_path / "vendor", "gemm")

"""Bad input of `flagperf run`, found before anything starts: sizes against the hosts' probe, host addresses,
option errors; and `validate` and `run` agree on every bad-input file of tests/fixtures/hostile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from flagperf.config.memory import USABLE_SHARE
from flagperf.config.plan import plan_run
from flagperf.errors import ConfigError
from flagperf.hosts.capacity import check_capacity
from flagperf.hosts.inventory import load_inventory, split_address
from flagperf.hosts.probe import host_memory_bytes
from flagperf.paths import PROJECT_ROOT
from flows.cli import app
from tests.unit.test_bad_input import _make  # the `make` list of tests/fixtures/hostile/README.md

HOSTILE = Path(__file__).resolve().parents[1] / "fixtures" / "hostile"  # format: its README.md
CLOSED_API = "http://127.0.0.1:1/api"  # a run wrongly accepted fails fast instead of starting a server


def flagperf(args: list[str], cwd: Path, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in its own process, as a user runs it."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
                   "PREFECT_HOME": str(cwd / ".prefect-home"), "PREFECT_API_URL": CLOSED_API, **env}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    said = f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    assert done.returncode == 2, said
    assert "Traceback" not in done.stdout + done.stderr, said
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error"), said
    return lines[0]


# ------------------------------------------------------------------------------------ sizes and hosts


def test_a_gemm_size_this_host_cannot_hold_is_refused_before_any_server(tmp_path: Path) -> None:
    """The issue's case: `--set m=...` on the smoke suite. The size is chosen from this machine's memory,
    the smallest square FP32 shape whose operands (3 x 4 bytes x s^2) exceed the share a case may fill."""
    usable = USABLE_SHARE * host_memory_bytes()
    side = next((s for s in (2 ** p for p in range(12, 17)) if 12 * s * s > usable), None)
    if side is None:
        pytest.skip("this machine holds even the largest GEMM a case accepts (m = n = k = 65536)")
    done = flagperf(["run", "--set", f"m={side}", "--set", f"n={side}", "--set", f"k={side}"], tmp_path)
    line = one_error_line(done)
    assert line.startswith(f"error: --set: computation-FP32.m: m={side}, n={side}, k={side} needs "), line
    assert "host localhost" in line, line
    assert "host(s) from" not in done.stdout  # the run's first line: printed only once the input is good
    assert not (tmp_path / "results").exists()


def test_sizes_against_a_device_probe() -> None:
    """The flow's check with a GPU host's probe (what flagperf.hosts.probe answers there): a size is refused
    against the smallest device's memory and named by the setting that made it; a probe without the figure
    (an older engine on the host) refuses nothing."""
    plan = plan_run(cases=["computation-FP32", "main_memory-bandwidth"], vendor="nvidia", sets=["m=65536"],
                    results_dir="/nonexistent-results")
    gib = 2 ** 30
    probe = {"device_visible": True, "device_count": 8, "device": "NVIDIA H100 80GB HBM3"}
    check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 80 * gib}})
    check_capacity(plan, ["gpu1"], {"gpu1": probe})
    check_capacity(plan, ["gpu1"], {"gpu1": None})
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["gpu1", "gpu2"], {"gpu1": {**probe, "device_memory_bytes": 80 * gib},
                                                 "gpu2": {**probe, "device_memory_bytes": 2 * gib}})
    message = str(info.value)
    assert message.startswith("--set: computation-FP32.m: m=65536, n=8192, k=8192 needs 4.25 GiB, more than 80% "
                              "of the 2.00 GiB on host gpu2 (NVIDIA H100 80GB HBM3)"), message


def test_an_embedding_table_counts_whole_against_a_device_probe() -> None:
    """An operator point needs its inputs as allocated, not only the rows the call reads: Llama-3-8B's fp32
    embedding table (128256 x 4096) does not fit a 2 GiB device at any batch, and the line names the model
    behind it, not the batch (which no smaller value would make fit)."""
    plan = plan_run(cases=["op-embedding-index"], vendor="nvidia",
                    sets=["dtypes=[fp32]", "batch_sizes=[1]", "seq_lens=[8]"], results_dir="/nonexistent-results")
    probe = {"device_visible": True, "device_count": 8, "device": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 2 * 2**30}})
    assert str(info.value) == (
        "cases/operation/op-embedding-index/case.yaml: op-embedding-index.models: embedding V128256xC4096xT8 in "
        "fp32 (llama-3-8b b1 s8; its inputs and output, and the cache flush's 256 MiB buffer: flush_cache: false "
        "leaves it out) needs 2.21 GiB, more than 80% of the 2.00 GiB on "
        "host gpu1 (NVIDIA H100 80GB HBM3)")
    check_capacity(plan, ["gpu1"], {"gpu1": {**probe, "device_memory_bytes": 3 * 2**30}})


def test_a_size_from_a_suite_names_the_suite(tmp_path: Path) -> None:
    suite = tmp_path / "big.yaml"
    suite.write_text("name: big\ndescription: x\ncases: [main_memory-bandwidth]\nrounds: 1\n"
                     "overrides:\n  main_memory-bandwidth:\n    size_mib: 1048576\n", encoding="utf-8")
    plan = plan_run(suite=str(suite), results_dir="/nonexistent-results")
    with pytest.raises(ConfigError) as info:
        check_capacity(plan, ["h"], {"h": {"device_memory_bytes": 64 * 2 ** 30}})
    assert str(info.value).startswith(f"{suite}: main_memory-bandwidth.size_mib: size_mib=1048576"), info.value


@pytest.mark.parametrize(("address", "host", "port"), [
    ("10.0.0.1", "10.0.0.1", None), ("10.0.0.1:2222", "10.0.0.1", 2222), ("node-7.lab", "node-7.lab", None),
    ("node_7:22", "node_7", 22), ("::1", "::1", None), ("[::1]", "::1", None), ("[fe80::1%eth0]:65535",
                                                                               "fe80::1%eth0", 65535),
])
def test_addresses_are_host_and_port(address: str, host: str, port: int | None) -> None:
    assert split_address(address) == (host, port)


@pytest.mark.parametrize(("address", "words"), [
    ("[::1]:99999", "port '99999'"), ("h:0", "port '0'"), ("h:", "port ''"), ("h:22x", "port '22x'"),
    ("10.0.0.256", "not an IPv4 address"), ("1.2.3", "not an IPv4 address"), ("a:b:c", "not an IPv6 address"),
    ("[10.0.0.1]:22", "not an IPv6 address"), ("-oProxyCommand=x", "not a host name"), ("a b", "not a host name"),
    ("x" * 64, "not a host name"), ("h..example", "not a host name"), ("", "not a host name"),
])
def test_bad_addresses_say_what_is_wrong(address: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        split_address(address)


def test_a_port_in_the_address_is_the_hosts_port(tmp_path: Path) -> None:
    """Over the inventory's defaults, and over host.yaml's SSH_PORT; the address alone is written down."""
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("defaults: {port: 2200}\nhosts:\n  - {name: a, address: '10.0.0.1:2222'}\n"
                         "  - {name: b, address: '[::1]:2201'}\n  - {name: c, address: 10.0.0.3}\n", encoding="utf-8")
    assert [(h.address, h.port) for h in load_inventory(inventory).hosts] == [
        ("10.0.0.1", 2222), ("::1", 2201), ("10.0.0.3", 2200)]
    host_yaml = tmp_path / "host.yaml"
    host_yaml.write_text("VENDOR: cpu\nSSH_PORT: 2200\nHOSTS: ['10.0.0.1:2222', 10.0.0.2]\n"
                         "CASES: {computation-FP32: pytorch}\n", encoding="utf-8")
    assert [(h.name, h.address, h.port) for h in load_inventory(host_yaml).hosts] == [
        ("10.0.0.1_2222", "10.0.0.1", 2222), ("10.0.0.2", "10.0.0.2", 2200)]


def test_a_usage_error_is_one_line_in_process() -> None:
    """Also where click is driven by another program (typer's runner): exit 2, one line, no usage box."""
    result = CliRunner().invoke(app, ["run", "--rounds", "1e9"])
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [
        line for line in result.output.splitlines() if line.startswith("error: Invalid value for '--rounds'")]
    help_result = CliRunner().invoke(app, ["run", "--help"])
    assert help_result.exit_code == 0 and "--rounds" in help_result.output


# ------------------------------------------------------------------ validate and run agree on every file


def _counterparts(folder: Path, runs: list[dict[str, Any]]) -> list[tuple[list[str], dict[str, Any]]]:
    """For every file a hostile input names, the other command on the same file, where the input does not
    list it itself: (args, the expectation it must meet, which is the listed command's)."""
    listed = [[str(a) for a in run["args"]] for run in runs]
    derived: list[tuple[list[str], dict[str, Any]]] = []
    for args, run in zip(listed, runs, strict=True):
        if args[0] == "validate":
            for name in args[1:]:
                other = _run_form(folder, name)
                # Several files with exit 2: which one was refused is not said; each alone is listed elsewhere.
                single = len(args) == 2 or run.get("exit", 2) != 2
                if other and single and not any(_names(a, name, folder) for a in listed if a[0] == "run"):
                    derived.append((other, run))
        elif args[0] == "run":
            named = _file_of_run(folder, args)
            if named and not any(named in a[1:] for a in listed if a[0] == "validate"):
                derived.append((["validate", named], run))
    return derived


def _run_form(folder: Path, name: str) -> list[str] | None:
    """How `run` reads the file `validate name` checks; None where run has no form for it."""
    parts = Path(name).parts
    if len(parts) >= 4 and parts[0] == "cases":
        case = parts[2]
        if parts[3] == "vendor" and len(parts) == 5 and name.endswith(".yaml"):
            vendor = Path(parts[4]).stem.removesuffix("_configurations")
            return ["run", "--cases", case, "--vendor", vendor]
        return ["run", "--cases", case] if len(parts) == 4 else None
    path = folder / name
    if not path.is_file() or path.is_symlink():
        return None  # not a regular file: what it is cannot be read; hostile inputs of that kind list both
    if path.suffix not in (".yaml", ".yml"):
        return None  # FlagPerf's Python configuration: run takes it with its cluster file (the input lists both)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return None  # not YAML at all: both commands refuse it as such, and the input lists what it runs
    if not isinstance(data, dict):
        return None
    if "HOSTS" in data:
        return ["run", "--host-config", name]
    if "hosts" in data:
        return ["run", "--inventory", name]
    return ["run", "--suite", name] if "cases" in data else None


def _names(run_args: list[str], name: str, folder: Path) -> bool:
    other = _run_form(folder, name) or []
    return name in run_args or (len(other) > 2 and other[1] == "--cases" and other[2] in run_args)


def _file_of_run(folder: Path, args: list[str]) -> str | None:
    for option in ("--suite", "--inventory", "--host-config"):
        if option in args and args.index(option) + 1 < len(args):
            name = args[args.index(option) + 1]
            return name if (folder / name).exists() or (folder / name).is_symlink() else None
    return None


AGREEMENT = [pytest.param(folder.name, " ".join(args), args, expectation, id=f"{folder.name}: {' '.join(args)}")
             for folder in sorted(p.parent for p in HOSTILE.glob("*/expect.yaml"))
             for args, expectation in _counterparts(
                 folder, yaml.safe_load((folder / "expect.yaml").read_text(encoding="utf-8"))["runs"])]


@pytest.mark.skipif(not AGREEMENT, reason="every file of every hostile input is given to both commands already")
@pytest.mark.parametrize(("name", "command", "args", "expectation"), AGREEMENT)
def test_validate_and_run_agree(name: str, command: str, args: list[str], expectation: dict[str, Any],
                                tmp_path: Path) -> None:
    """A file `validate` refuses is refused by `run` in the same words, and one it accepts is not refused as
    bad input by `run` (which then goes on, here against a closed API); and the other way round."""
    expect = yaml.safe_load((HOSTILE / name / "expect.yaml").read_text(encoding="utf-8"))
    copy = tmp_path / name
    shutil.copytree(HOSTILE / name, copy, symlinks=True)
    _make(copy, expect.get("make") or [])
    done = flagperf(args, copy, timeout_s=expect.get("timeout_s", 300),
                    FLAGPERF_CASE_PATH=str(copy / "cases"), FLAGPERF_SUITE_PATH=str(copy / "suites"),
                    FLAGPERF_VENDOR_PATH=str(copy / "vendor_images"))
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-2000:]
    if expectation.get("exit", 2) == 2:
        line = one_error_line(done)
        for part in [expectation["error"]] if isinstance(expectation.get("error"), str) else expectation.get(
                "error") or []:
            assert part in line, f"{command}: {part!r} not in {line!r}"
        assert not (copy / "results").exists(), f"{command}: a refused run left its results folder"
    else:
        assert done.returncode != 2, f"{command}: refused what the other command accepts: {done.stderr[-2000:]}"

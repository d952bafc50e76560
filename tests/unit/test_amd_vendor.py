"""The amd vendor: a second accelerator vendor that is not CUDA-shaped in its tools, added as a folder only.

It cannot run here (no AMD GPU): its manifest, container options, image build logic, peak table, toolkit and
monitor parser are checked on this machine; the parser on published amd-smi output (tests/fixtures/amdsmi).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.basespec.toolkit import find_toolkit
from flagperf.config.vendors import import_file, load_vendor
from flagperf.hosts.docker import container_settings, context_digest, image_context, image_tag
from flagperf.hosts.inventory import HostSpec
from flagperf.paths import PROJECT_ROOT

AMD = PROJECT_ROOT / "vendor_images" / "amd"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "amdsmi"


@pytest.fixture(scope="module")
def monitor() -> object:
    return import_file(AMD / "monitor_amdsmi.py", "flagperf_test_amd_monitor")


@pytest.fixture(scope="module")
def spec() -> object:
    return import_file(AMD / "spec.py", "flagperf_test_amd_spec")


def test_no_core_module_names_the_amd_vendor() -> None:
    """Adding the vendor touched only its folder: no code of the core, the tasks or the flows names it, its
    parts or its tools (in strings and names; comments aside). The environment allow-lists that forward
    whole stacks' variables (HIP_*, ROCM_*, as CUDA_*, ASCEND_*) to every vendor's case predate it."""
    words = ("amd", "amdsmi", "amd-smi", "instinct", "kfd", "/dev/kfd", "hipblaslt", "rocblas", "gfx942", "gfx950",
             "mi300x", "mi325x", "mi355x")
    found = []
    for package in ("flagperf", "tasks", "flows"):
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else \
                    node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
                if text is None:
                    continue
                tokens = {t for t in "".join(c if c.isalnum() or c == "-" else " " for c in text.lower()).split()}
                hits = tokens & set(words)
                if hits:
                    found.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}: {sorted(hits)}")
    assert not found, "core code names the amd vendor:\n" + "\n".join(found)


def test_the_manifest_loads_with_rocm_devices_and_no_cuda_request() -> None:
    vendor = load_vendor("amd")
    options = vendor.manifest.container
    assert vendor.manifest.torch_device == "cuda"  # ROCm torch's device type
    assert options.devices == ["/dev/kfd", "/dev/dri"] and options.device_requests == []
    assert options.visible_devices_env == "HIP_VISIBLE_DEVICES" and not options.privileged
    assert [m.name for m in vendor.manifest.monitors] == ["system", "amdsmi"]
    host = HostSpec.model_validate({"name": "mi300", "address": "10.0.0.9", "visible_devices": "0,1"})
    settings = container_settings(vendor, host, "flagperf/amd-pytorch:abc")
    assert settings.devices == ["/dev/kfd", "/dev/dri"] and settings.device_requests == []
    assert settings.env["HIP_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in settings.env


def test_the_image_is_built_from_its_folder_by_content_hash_like_nvidias(tmp_path: Path) -> None:
    vendor = load_vendor("amd")
    context = image_context(vendor, None)
    assert context == AMD / "pytorch"
    assert {p.name for p in context.iterdir()} >= {"Dockerfile", "pytorch_install.sh", "requirements.txt"}
    text = (context / "Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE}" in text and "ARG BASE_IMAGE=rocm/pytorch:" in text
    digest = context_digest(context, {"BASE_IMAGE": "rocm/pytorch:latest"})
    assert image_tag("amd", "pytorch", digest) == f"flagperf/amd-pytorch:{digest[:16]}"
    assert digest != context_digest(context)  # the build args are part of the tag
    # Every file the Dockerfile copies is in the build context.
    for line in text.splitlines():
        if line.startswith("COPY"):
            assert all((context / name).is_file() for name in line.split()[1:-1]), line


def test_peaks_come_from_datasheets_with_sources(spec: object) -> None:
    sheets = spec.datasheets()  # type: ignore[attr-defined]
    names = {name for entry in sheets for name in entry["names"]}
    assert {"AMD Instinct MI300X", "AMD Instinct MI325X", "AMD Instinct MI355X"} <= names
    assert all("https://www.amd.com/" in entry["source"] for entry in sheets)
    table = spec.peaks_for("AMD Instinct MI300X", "gfx942", 192 * 2**30)  # type: ignore[attr-defined]
    peaks = table["peaks"]
    assert peaks["bf16"]["value"] == 1307.4 and peaks["fp8"]["value"] == 2614.9
    assert peaks["memory_bandwidth"]["value"] == 5300 and "MI300X" in peaks["fp8"]["source"]
    mi355 = spec.peaks_for("AMD Instinct MI355X", "gfx950", 288 * 2**30)["peaks"]  # type: ignore[attr-defined]
    assert mi355["fp16"]["value"] == 2516.6 and mi355["tf32"]["value"] is None and mi355["tf32"]["supported"] is False
    unknown = spec.peaks_for("AMD Instinct MI250X", "gfx90a", 2**30)["peaks"]  # type: ignore[attr-defined]
    assert unknown["bf16"]["value"] is None and "datasheets.yaml" in unknown["bf16"]["source"]


def test_the_toolkit_provides_gemm_through_hipblaslt() -> None:
    folder, manifest = find_toolkit(AMD, "gemm")
    assert folder.name == "hipblaslt_gemm" and manifest.requires == ["hipcc"]
    source = (folder / "gemm.hip").read_text()
    assert "hipblasLtMatmul(" in source and "#include <cublas" not in source


def test_the_monitor_reads_published_amd_smi_output(monitor: object) -> None:
    parse = monitor.parse_metric  # type: ignore[attr-defined]
    [w7700] = parse(json.loads((FIXTURES / "metric_usage_w7700.json").read_text()))
    assert w7700["index"] == 0 and w7700["util_percent"] == 42 and w7700["mem_util_percent"] == 1
    assert w7700["power_w"] is None and w7700["sm_clock_mhz"] is None and w7700["throttle"] is None

    [rx] = parse(json.loads((FIXTURES / "metric_rx7800xt.json").read_text()))  # the gpu_data form
    assert rx["util_percent"] == 2 and rx["temp_c"] == 41
    assert rx["mem_used_bytes"] == 14569 * 2**20 and rx["mem_total_bytes"] == 16368 * 2**20

    [blind] = parse(json.loads((FIXTURES / "metric_watch_all_na.json").read_text()))
    # Every field N/A: unavailable (None), never 0.
    assert {k: v for k, v in blind.items() if k != "index"} == dict.fromkeys(
        [k for k in blind if k != "index"], None)


def test_the_monitor_reads_throttle_status_and_clocks(monitor: object) -> None:
    document = {"gpu_data": [{"gpu": 3, "power": {"socket_power": {"value": 712, "unit": "W"},
                                                  "throttle_status": "THROTTLED"},
                              "clock": {"gfx_0": {"clk": {"value": 1650, "unit": "MHz"},
                                                  "max_clk": {"value": 2100, "unit": "MHz"}}},
                              "temperature": {"edge": {"value": 55, "unit": "C"}, "hotspot": "N/A"}}]}
    [sample] = monitor.parse_metric(document)  # type: ignore[attr-defined]
    assert sample["power_w"] == 712 and sample["throttle"] == ["throttled"] and sample["clock_event_bits"] == 1
    assert sample["sm_clock_mhz"] == 1650 and sample["max_sm_clock_mhz"] == 2100 and sample["temp_c"] == 55
    assert monitor.throttle_bits("UNTHROTTLED") == 0  # type: ignore[attr-defined]
    assert monitor.visible_indices("1,3", None) == [1, 3]  # type: ignore[attr-defined]
    assert monitor.visible_indices(None, "2") == [2]  # type: ignore[attr-defined]
    assert monitor.visible_indices("GPU-5c2b", None) is None  # type: ignore[attr-defined]


def test_without_amd_smi_the_monitor_says_so_and_exits(tmp_path: Path) -> None:
    """The monitor contract, run for real: no amd-smi on PATH -> a header saying why, no samples, exit 0."""
    out = tmp_path / "monitor_amdsmi.jsonl"
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on it
    completed = subprocess.run([sys.executable, str(AMD / "monitor_amdsmi.py"), "--out", str(out), "--interval", "1",
                                "--max-seconds", "5"], env=env, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["sources"]["devices"]["available"] is False
    assert "amd-smi unavailable: not on PATH" in lines[0]["sources"]["devices"]["reason"]
    assert lines[-1] == {**lines[-1], "type": "footer", "samples": 0, "reason": "unavailable"}

"""A vendor's case adaptation (FlagPerf's vendor guide) through the real evaluate flow on this machine: the
environment file, requirements.txt from a local wheel, a C extension in csrc/ built with the host compiler and
the extern hooks, each seen by the training processes, recorded in result.json, and built once, not per round."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prefect_api import run_evaluate

from flagperf.measure.perflog import parse_file
from flagperf.results.schema import read_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vendor_adaptation"


@pytest.fixture
def adapted_case(flagperf_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture's case copied to tmp_path, its vendor's wheel built there; the test vendor on the vendor path."""
    cases = tmp_path / "cases"
    shutil.copytree(FIXTURE / "cases", cases)
    wheels = cases / "training" / "adapted-mlp" / "vendor" / "testvendor" / "wheels"
    source = tmp_path / "wheel_src"
    shutil.copytree(FIXTURE / "wheel_src", source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(wheels), str(source)], check=True, capture_output=True)
    assert [p.name for p in wheels.glob("*.whl")] == ["testvendor_helper-0.1-py3-none-any.whl"]
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(FIXTURE / "vendors"))
    return flagperf_env


def test_every_adaptation_point_reaches_the_case_and_is_recorded(adapted_case: Path, tmp_path: Path) -> None:
    state, run_dir = run_evaluate(adapted_case, cases=["adapted-mlp"], vendor="testvendor", rounds=2)
    assert state.is_completed(), state.message
    records = []
    for round_no in (1, 2):
        folder = run_dir / "adapted-mlp" / f"round{round_no}" / "localhost_noderank0"
        result = read_result(folder / "result.json")
        assert result.status == "success", result.failure
        extra = parse_file(folder / "rank0.out.log").finished()[0]["extra"]
        # What the extern hook found in the training process: every adaptation point reached it.
        assert extra["testvendor"] == {"mode": "fast", "paths": "/opt/testvendor/lib:fast",
                                       "helper": "hello from testvendor-helper", "fma3": 42, "steps_seen": 4}
        adaptation = result.provenance.adaptation
        assert adaptation is not None
        assert adaptation["hooks_called"] == ["setup_distributed", "wrap_model", "make_optimizer", "on_step"]
        assert adaptation["hooks"] == ["wrap_model", "make_optimizer", "setup_distributed", "on_step"]
        assert adaptation["env_applied"] == {"TESTVENDOR_MODE": "fast", "TESTVENDOR_PATHS": "/opt/testvendor/lib:fast"}
        assert adaptation["requirements"].endswith("vendor/testvendor/requirements.txt")
        # Each round keeps the log of the build it used.
        assert "Successfully installed testvendor-helper-0.1" in (folder / "adaptation_requirements.log").read_text()
        assert "testvendor_tinyop" in (folder / "adaptation_csrc_build.log").read_text()
        records.append(adaptation["installs"])
    # Built once per content (and image and host), not per round: the second round found the first's build.
    assert [r["csrc"]["status"] for r in records] == ["built", "cached"]
    assert [r["requirements"]["status"] for r in records] == ["built", "cached"]
    assert records[0]["csrc"]["key"] == records[1]["csrc"]["key"]
    built = Path(records[0]["csrc"]["path"])
    assert built.parent == tmp_path / "work" / "adaptations" and (built / ".complete").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["counts"]["success"] == 2


def test_a_failed_csrc_build_fails_the_round_naming_it(adapted_case: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptation kept in the vendor's own folder (cases/<family>/<case>/ there, as a vendor of its own
    repository keeps it), its settings file too: the plan and the round read them from there, and the failure
    names the file there. The failed round's record says what was applied before the build failed: the
    environment (a secret masked) and the requirements' install; env_applied was empty. The host's secrets, which its
    inventory env passes to it, are masked however a line takes them: the index URL with its password copied under
    a name that says nothing (MIRROR=$PIP_INDEX_URL), and a copy of a copy of the host's token (B=x$A, A=$HF_TOKEN)
    were each recorded in the clear."""
    vendors = tmp_path / "vendors"
    shutil.copytree(FIXTURE / "vendors", vendors)
    kept = vendors / "testvendor" / "cases" / "training" / "adapted-mlp"
    kept.parent.mkdir(parents=True)
    shutil.move(tmp_path / "cases" / "training" / "adapted-mlp" / "vendor" / "testvendor", kept)
    (kept / "testvendor.yaml").write_text("timeout_s: 600\n")
    with (kept / "environment_variables.sh").open("a") as env:
        env.write("TESTVENDOR_TOKEN=not-for-the-record\nMIRROR=$PIP_INDEX_URL\nTESTVENDOR_A=$HF_TOKEN\n"
                  "TESTVENDOR_B=x$TESTVENDOR_A\n")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(vendors))
    # requirements.txt installs with --no-index: the index URL is never used
    monkeypatch.setenv("FP_TEST_INDEX_URL", "https://bob:hunter2@mirror.invalid/simple")
    monkeypatch.setenv("FP_TEST_HF_TOKEN", "hf_host_canary")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"hosts": [{"name": "localhost", "env": {
        "PIP_INDEX_URL": "${FP_TEST_INDEX_URL}", "HF_TOKEN": "${FP_TEST_HF_TOKEN}"}}]}), encoding="utf-8")
    source = kept / "csrc" / "tinyop.c"
    source.write_text(source.read_text() + "\nthis is not C;\n")
    state, run_dir = run_evaluate(adapted_case, cases=["adapted-mlp"], vendor="testvendor", inventory=str(inventory))
    assert state.is_failed()
    planned = json.loads((run_dir / "plan.json").read_text())["cases"][0]
    assert planned["vendor_folder"] == str(kept)
    assert planned["config"]["timeout_s"] == 600 and planned["origins"]["timeout_s"] == str(kept / "testvendor.yaml")
    folder = run_dir / "adapted-mlp" / "round1" / "localhost_noderank0"
    result = read_result(folder / "result.json")
    assert result.status == "failed" and result.failure.kind == "user"
    message = result.failure.message
    assert f"{kept}/csrc/setup.py: build failed" in message and "adaptation_csrc_build.log" in message, message
    assert "\n" not in message
    assert result.provenance.adaptation is not None and result.provenance.adaptation["folder"] == str(kept)
    assert result.provenance.adaptation["env"]["TESTVENDOR_MODE"] == "fast"
    masked = dict.fromkeys(("TESTVENDOR_TOKEN", "MIRROR", "TESTVENDOR_A", "TESTVENDOR_B"), "<masked>")
    assert result.provenance.adaptation["env_applied"] == {"TESTVENDOR_MODE": "fast", "TESTVENDOR_PATHS":
                                                           "/opt/testvendor/lib:fast", **masked}
    assert result.provenance.adaptation["installs"]["requirements"]["status"] in ("built", "cached")
    recorded = (folder / "result.json").read_text()
    assert all(secret not in recorded for secret in ("not-for-the-record", "hunter2", "hf_host_canary"))
    assert "error" in (folder / "adaptation_csrc_build.log").read_text().lower()

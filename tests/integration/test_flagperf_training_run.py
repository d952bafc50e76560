"""`flagperf run --test-conf test_conf.py --cluster-conf cluster_conf.py`: FlagPerf training's own files run
through the CLI and the real flow on this machine, in a container from the cpu vendor's Dockerfile (FlagPerf
runs every case in a container), with a real Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.results.schema import read_result
from tests.testbed.bed import Testbed, make_testbed_fixture
from tests.unit.mounts import data_folder

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]
testbed = make_testbed_fixture(min_hosts=1)  # its Docker engine and base image
ROOT = Path(__file__).resolve().parents[2]


def test_flagperf_training_confs_run_through_the_cli(tmp_path: Path, testbed: Testbed) -> None:
    import docker

    # No registry here: the test bed's base stands in for the Dockerfile's default base image.
    docker.from_env().images.get(testbed.base_image).tag("python", "3.11-slim-bookworm")
    with data_folder() as data:  # mounted into the case's container: a real folder under a data root
        _run_through_the_cli(tmp_path, data)


def _run_through_the_cli(tmp_path: Path, data: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    config = tmp_path / "run_benchmarks" / "config"
    config.mkdir(parents=True)
    (config / "cluster_conf.py").write_text("'''Cluster configs'''\nHOSTS = [\"localhost\"]\nSSH_PORT = \"22\"\n"
                                            "MASTER_PORT = \"29501\"\n", encoding="utf-8")
    (config / "test_conf.py").write_text(
        "'''Test Configs, including'''\n"
        "VENDOR = \"cpu\"\nACCE_CONTAINER_OPT = \"\"\nACCE_VISIBLE_DEVICE_ENV_NAME = \"CUDA_VISIBLE_DEVICES\"\n"
        f"FLAGPERF_PATH = {str(ROOT)!r}\nFLAGPERF_LOG_PATH = {str(tmp_path)!r} + \"/result/\"\n"
        "SHM_SIZE = \"1G\"\nCLEAR_CACHES = True\n"
        # digits-mlp at 1x2: the cpu vendor's config_cpux1x2.yaml applies; repeat 2: two rounds.
        f"CASES = {{\"digits-mlp:pytorch_2.3:cpu:1:2:2\": {str(data)!r}}}\n", encoding="utf-8")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--test-conf", str(config / "test_conf.py"),
                          "--cluster-conf", str(config / "cluster_conf.py"), "-v"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "CLEAR_CACHES is not used" in run.stderr
    assert "is mounted, not read: digits-mlp reads no data dir" in run.stderr
    assert "1 cases x 2 rounds" in run.stdout and "1 host(s)" in run.stdout
    (run_dir,) = (tmp_path / "result").glob("run*")  # FLAGPERF_LOG_PATH
    for round_no in (1, 2):
        folder = run_dir / "digits-mlp" / f"round{round_no}" / "localhost_noderank0"
        result = read_result(folder / "result.json")
        assert result.status == "success" and result.provenance.image["runtime"] == "docker"
        assert (result.config["nproc_per_node"], result.config["batch_size"]) == (2, 48)
        assert result.convergence is not None and result.convergence.converged
        assert (folder / "rank1.out.log").is_file()

"""A missing optional package is one line naming the extra that installs it, never a traceback.

The packages are made missing the way Python itself blocks an import (None in sys.modules, also set up in
the training worker processes through a sitecustomize on PYTHONPATH): the engine's own import code runs
and meets a real ModuleNotFoundError.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rounds import run_local_round

from flagperf.config.cases import load_case
from flagperf.config.plan import plan_run
from flagperf.errors import EXIT_USER_ERROR, MissingExtra, install_command, require
from flagperf.results.history import history_engine
from flagperf.results.schema import read_result


def block(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *modules: str) -> None:
    """Make ``modules`` fail to import here and in every Python this test starts."""
    for name in modules:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)
    site = tmp_path / "blocked-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in modules))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{Path(__file__).resolve().parents[2]}")


def run_round(tmp_path: Path, case: str, *sets: str) -> tuple[int, str]:
    code, out = run_local_round(tmp_path, case, *sets)
    result = read_result(out / "result.json")
    assert result.failure is not None and result.failure.kind == "user"
    return code, result.failure.message


def test_training_data_reader_missing_names_the_training_extra(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # digits-mlp reads scikit-learn's digits inside its training processes.
    block(monkeypatch, tmp_path, "sklearn")
    code, message = run_round(tmp_path, "digits-mlp", "master_port=29731")
    assert code == EXIT_USER_ERROR
    assert message == f"case digits-mlp needs scikit-learn, which is not installed: {install_command('training')}"


def test_inference_engine_missing_names_the_inference_extra(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    block(monkeypatch, tmp_path, "onnxruntime")
    code, message = run_round(tmp_path, "digits-infer")
    assert code == EXIT_USER_ERROR
    assert message.startswith("engine onnxruntime (")
    assert message.endswith(f"needs onnxruntime, which is not installed: {install_command('inference')}")
    assert "\n" not in message


@pytest.mark.parametrize(("case", "extra"), [("llama-pretrain", "training"), ("bert-large-infer", "inference")])
def test_model_definitions_missing_name_the_case_familys_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               case: str, extra: str) -> None:
    # transformers serves both families: the extra named is the one that installs what this case needs.
    block(monkeypatch, tmp_path, "transformers")
    with pytest.raises(MissingExtra) as caught:
        load_case(case).module  # noqa: B018  (importing the case's file is the point)
    assert caught.value.extra == extra
    assert str(caught.value).endswith(f"needs transformers, which is not installed: {install_command(extra)}")
    # Before any round: planning validates the case's Config and stops with the same line.
    with pytest.raises(MissingExtra):
        plan_run(cases=[case], results_dir=tmp_path / "results")


def test_postgres_history_without_the_driver_names_the_postgres_extra(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    block(monkeypatch, tmp_path, "psycopg")
    with pytest.raises(MissingExtra, match=r"\[postgres\]'$"):
        history_engine("postgresql+asyncpg://flagperf@127.0.0.1:1/none")


def test_a_package_no_extra_provides_stays_a_real_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A broken install or a bug must not be dressed up as a missing extra.
    block(monkeypatch, tmp_path, "json")
    with pytest.raises(ModuleNotFoundError):
        require("json")
    require("yaml")  # present: nothing happens


def test_nvml_monitor_without_nvidia_ml_py_names_the_nvidia_extra(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    import json
    import subprocess

    block(monkeypatch, tmp_path, "pynvml")
    out = tmp_path / "nvml.jsonl"
    script = Path(__file__).resolve().parents[2] / "vendor_images" / "nvidia" / "monitor_nvml.py"
    subprocess.run([sys.executable, str(script), "--out", str(out), "--interval", "1", "--max-seconds", "5"],
                   check=True, timeout=120)
    header = json.loads(out.read_text().splitlines()[0])
    assert header["sources"]["devices"] == {"available": False, "reason": (
        f"NVML unavailable: needs nvidia-ml-py, which is not installed: {install_command('nvidia')}")}


EXTRAS_ONLY = ["sklearn", "scipy", "transformers", "onnx", "onnxruntime", "mlperf_loadgen", "psycopg", "rouge_score",
               "pynvml"]


def test_the_default_install_runs_without_any_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `pip install -e .` then `flagperf run`: the CLI, the flows and tasks, the in-host entry and the smoke suite's
    # plan must import with no package of an extra (a module-level `import transformers` in a shared module
    # would fail every round of every case).
    import subprocess

    block(monkeypatch, tmp_path, *EXTRAS_ONLY)
    script = ("import importlib, pkgutil, tasks, flows\n"
              "for pkg in (tasks, flows):\n"
              "    for m in pkgutil.iter_modules(pkg.__path__):\n"
              "        importlib.import_module(pkg.__name__ + '.' + m.name)\n"
              "import flagperf.entry, flagperf.training.worker, flagperf.hosts.agent, flagperf.hosts.probe\n"
              "from flagperf.config.plan import plan_run\n"
              f"plan = plan_run(suite='smoke', results_dir={str(tmp_path / 'results')!r})\n"
              "print(','.join(c.name for c in plan.cases))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "computation-FP32" in done.stdout

"""Nothing half-written, nothing followed, nothing leaked: atomic writes on a real full file system, result
copies that read back and never follow links, the environment cases inherit, masked host specs, private
work roots, engine files inside their folder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounts import mounted_tmpfs

from flagperf.errors import ConfigError
from flagperf.hosts.inventory import MASK, HostSpec, host_spec, load_inventory
from flagperf.hosts.local import LocalHost, allowed_environment, private_folder_problem
from flagperf.paths import PROJECT_ROOT
from flagperf.results.schema import write_json_atomic, write_text_atomic
from tasks.collect import verify_copy


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real ENOSPC, no faking."""
    with mounted_tmpfs(tmp_path / "tiny", "size=1m") as folder:
        yield folder


def test_a_write_that_does_not_fit_leaves_the_old_file_and_no_debris(tiny_disk: Path) -> None:
    target = tiny_disk / "summary.json"
    write_json_atomic(target, {"round": 1})
    with pytest.raises(OSError) as info:
        write_text_atomic(target, "x" * (2 << 20))
    assert info.value.errno == 28
    assert json.loads(target.read_text()) == {"round": 1}  # the old file, whole
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["summary.json"]  # no .tmp, no 0-byte file


def test_fetch_tree_copies_files_not_links_and_lists_what_it_copied(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not for the results")
    stage = tmp_path / "stage"
    (stage / "attempt1").mkdir(parents=True)
    (stage / "attempt1" / "result.json").write_text("{}")
    (stage / "attempt1" / "link.txt").symlink_to(secret)
    (stage / "linked-folder").symlink_to(secret.parent)
    sizes = LocalHost(work_root=tmp_path / "work").fetch_tree(stage, tmp_path / "copy")
    assert sizes == {"attempt1/result.json": 2}
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["attempt1", "attempt1/result.json"]


def test_a_short_copy_is_caught_before_the_original_is_deleted(tmp_path: Path) -> None:
    (tmp_path / "result.json").write_text("{}")
    verify_copy(tmp_path, {"result.json": 2})
    with pytest.raises(OSError, match="has 2 bytes, the host's has 5"):
        verify_copy(tmp_path, {"result.json": 5})
    with pytest.raises(OSError, match="has None bytes"):
        verify_copy(tmp_path, {"monitor_system.jsonl": 10})


def test_cases_get_an_allow_listed_environment() -> None:
    env = allowed_environment({
        "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0", "ASCEND_RT_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "4",
        "PREFECT_API_URL": "http://127.0.0.1:4200/api", "PGPASSWORD": "x", "PREFECT_API_KEY": "x", "HF_TOKEN": "x",
        "AWS_SECRET_ACCESS_KEY": "x", "FLAGPERF_HISTORY_URL": "x", "SOMETHING_ELSE": "x",
        "PREFECT_API_DATABASE_CONNECTION_URL": "x", "FLAGPERF_MIRROR": "https://user:pw@mirror/simple",
        "PREFECT_API_AUTH_STRING": "admin:x", "VLLM_API_KEY": "x", "HF_HUB_TOKEN": "x",
    })
    assert env == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0", "ASCEND_RT_VISIBLE_DEVICES": "1",
                   "OMP_NUM_THREADS": "4", "PREFECT_API_URL": "http://127.0.0.1:4200/api"}


def test_host_specs_are_masked_when_written_and_real_in_this_process(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAGPERF_TEST_TOKEN", "from-the-environment")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - name: a\n    env: {LITERAL: s3cret, REF: '${FLAGPERF_TEST_TOKEN}'}\n"
                   "    docker: {build_args: {TOKEN: b4ild}, extra_options: '-e X=s3cret --gpus all'}\n")
    spec = load_inventory(inv).hosts[0]
    written = spec.model_dump(mode="json")
    text = json.dumps(written)
    assert "s3cret" not in text and "b4ild" not in text and "from-the-environment" not in text
    assert written["env"] == {"LITERAL": MASK, "REF": "${FLAGPERF_TEST_TOKEN}"}
    assert host_spec(written) == spec  # a subflow in this process gets the real values back
    assert spec.runtime_env() == {"LITERAL": "s3cret", "REF": "from-the-environment"}
    elsewhere = HostSpec.model_validate(written)  # what a worker on another machine would have
    with pytest.raises(ConfigError, match="never sent to a host's worker"):
        elsewhere.runtime_env()


def test_a_work_root_someone_else_can_write_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "work"
    assert private_folder_problem(root) is None and root.stat().st_mode & 0o777 == 0o700
    root.chmod(0o733)
    assert private_folder_problem(root) == "mode 733"
    link = tmp_path / "link"
    link.symlink_to(root)
    assert private_folder_problem(link) == "not a folder (a link?)"
    # The same check, as the SSH host runs it on the remote side through the host agent.
    done = subprocess.run([sys.executable, "-m", "flagperf.hosts.agent", "work-root", str(root), "--strict"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"problem": "mode 733"}


def test_an_engine_file_outside_its_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flagperf.inference.engines import load_engine

    vendor_root = tmp_path / "vendors"
    engine = vendor_root / "cpu" / "engines" / "escape"
    engine.mkdir(parents=True)
    (tmp_path / "outside.py").write_text("raise SystemExit('imported from outside')\n")
    (engine / "engine.yaml").write_text("name: escape\ndescription: x\nfile: ../../../../outside.py\n")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(vendor_root))
    with pytest.raises(ConfigError, match="outside the engine's folder"):
        load_engine("cpu", "escape")


def test_a_link_loop_is_an_eloop_error_on_every_python(tmp_path: Path) -> None:
    """Python 3.13's resolve() no longer raises on a loop (it returns the link): files.resolved says so anyway,
    so `inside` still names the loop instead of accepting a path that can never be read."""
    import errno

    from flagperf.config.files import inside, resolved

    (tmp_path / "loop.c").symlink_to("loop.c")
    with pytest.raises(OSError) as raised:
        resolved(tmp_path / "loop.c")
    assert raised.value.errno == errno.ELOOP
    with pytest.raises(ConfigError, match="a link that leads back to itself"):
        inside(tmp_path, "loop.c", "case.yaml", "csrc", "the vendor's case folder")
    assert resolved(tmp_path) == tmp_path.resolve()

"""`flagperf vendor check FOLDER`: one line per finding, exit 0 / 1 (problems) / 2 (not a vendor folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flagperf.config.vendors import MANIFEST, Vendor, load_vendor_manifest
from flagperf.errors import one_line
from flagperf.hosts.buildsteps import SHLEX_LIMIT, shell_words
from flagperf.hosts.vendorcheck import Findings, _check_image, check_vendor_folder
from flagperf.paths import PROJECT_ROOT, display_path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vendor_adaptation"
# vendor check's words for what the engine's builder (Docker's classic one) refuses, spelt out to be held to them.
CLASSIC_BUILDER = "the engine builds with Docker's classic builder (docker-py's build, not BuildKit)"
NO_HEREDOCS = (f"{CLASSIC_BUILDER}, which has no heredocs: an older Docker reads its lines as instructions (\"unknown "
               "instruction\"), a newer one runs the first line alone and says nothing (RUN <<EOF runs nothing, cat "
               "<<EOF > f writes an empty file); put what it holds in a file beside the Dockerfile and COPY it (a "
               "script: then RUN bash it)")


def heredoc_problem(dockerfile: Path, number: int, opened: str) -> str:
    """vendor check's line for a heredoc at this line of this Dockerfile: NO_HEREDOCS, as every finding is shown, in
    one line of at most MAX_LINE characters (a deep temporary folder shortens its middle, never what it says to do)."""
    return one_line(f"line {number}: RUN ... {opened}: {NO_HEREDOCS}", lead=f"{display_path(dockerfile)}:")


def flagperf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=PROJECT_ROOT)


def test_the_amd_folder_passes_with_what_this_machine_cannot_check_said() -> None:
    found = check_vendor_folder(PROJECT_ROOT / "vendor_images" / "amd", monitor_seconds=1)
    assert found.problems == []
    # Each line names the file it is about: the monitor's script, the spec module, the manifest.
    assert any(line.startswith("monitor amdsmi (vendor_images/amd/monitor_amdsmi.py): ") and "amd-smi unavailable"
               in line for line in found.not_checkable), found.not_checkable
    assert any(line.startswith("peaks: ") and "vendor_images/amd/spec.py" in line for line in found.not_checkable)
    assert any(line.startswith("monitor system (flagperf.monitoring.system): ") for line in found.passed)


@pytest.fixture
def broken_vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test vendor with a Dockerfile that copies a missing file, a monitor that crashes, a datasheet entry
    without a source, and a case adaptation whose extern hook loads a checkpoint."""
    vendor = tmp_path / "vendors" / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", vendor)
    (vendor / "pytorch" / "Dockerfile").write_text("FROM scratch\nCOPY missing.txt /x\nRUN sh install.sh\n")
    (vendor / "crash.py").write_text("raise SystemExit('no device tool')\n")
    manifest = (vendor / "vendor.yaml").read_text().replace(
        "    module: flagperf.monitoring.system\n", "    module: flagperf.monitoring.system\n  - name: crash\n"
                                                   "    script: crash.py\n")
    (vendor / "vendor.yaml").write_text(manifest)
    (vendor / "datasheets.yaml").write_text("- names: [X1]\n  fp32: 1.0\n")
    cases = tmp_path / "cases"
    shutil.copytree(FIXTURE / "cases", cases)
    hooks = cases / "training" / "adapted-mlp" / "vendor" / "testvendor" / "extern" / "hooks.py"
    hooks.write_text("import torch\n\ndef wrap_model(model, ctx):\n    model.load_state_dict(torch.load('x.pt'))\n"
                     "    return model\n")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    return vendor


def test_problems_are_one_line_each(broken_vendor: Path) -> None:
    found = check_vendor_folder(broken_vendor, monitor_seconds=1)
    problems = "\n".join(found.problems)
    assert "line 2: copies missing.txt" in problems
    assert "crash.py): exited 1 when run as `python " in problems and "crash.py --out FILE" in problems
    assert "--max-seconds 1`: no device tool" in problems
    assert "datasheets.yaml: entry 0: no source" in problems
    assert "extern/hooks.py: line 4: load_state_dict: loads weights" in problems
    assert "extern/hooks.py: line 4: torch.load loads weights" in problems  # every forbidden name, not the first
    assert len(found.problems) == 5 and all("\n" not in p for p in found.problems)


def test_exit_codes(broken_vendor: Path, tmp_path: Path) -> None:
    bad = flagperf("vendor", "check", str(broken_vendor))
    assert bad.returncode == 1 and bad.stdout.count("problem ") == 5, bad.stdout + bad.stderr
    missing = flagperf("vendor", "check", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "not a vendor folder" in missing.stderr


def test_a_dockerfile_that_is_no_longer_a_file_is_a_problem_not_a_hang(tmp_path: Path) -> None:
    """The Dockerfile was a regular file when the manifest was read; made a FIFO since, it is not read (reading a
    FIFO blocks until a writer comes)."""
    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    manifest = load_vendor_manifest(folder / MANIFEST)
    dockerfile = folder / manifest.container.dockerfile
    dockerfile.unlink()
    os.mkfifo(dockerfile)
    found = Findings()
    _check_image(Vendor(manifest=manifest, location=str(folder)), found)
    assert found.problems == [f"{display_path(dockerfile)}: not a regular file but a named pipe (FIFO); not read"]


def test_container_options_docker_would_refuse_on_the_host_are_found_here(tmp_path: Path) -> None:
    """A scaffolded vendor's container options, filled in wrongly: each would fail only when a round's container is
    created on the host (docker's --shm-size, --ulimit, the device policy); vendor check names file and key."""
    import yaml

    from flagperf.hosts.vendorcheck import _check_container
    from flagperf.hosts.vendorscaffold import write_vendor_folder

    folder = write_vendor_folder(tmp_path, "acme")
    path = folder / MANIFEST
    manifest = yaml.safe_load(path.read_text())
    manifest["container"].update(shm_size="16gb", ulimits={"mem_lock": -1, "nofile": -1, "memlock": -1, "stack": -2},
                                 devices=["/dev/acme0", "/dev/infiniband/uverbs0"], ipc="hostt")
    path.write_text(yaml.safe_dump(manifest))
    found = Findings()
    _check_container(Vendor(manifest=load_vendor_manifest(path), location=str(folder)), found)
    where = display_path(path)
    assert [p.split(": ", 2)[:2] for p in found.problems] == [
        [where, "container.shm_size"], [where, "container.ulimits.mem_lock"], [where, "container.ulimits.nofile"],
        [where, "container.ulimits.stack"], [where, "container.devices.0"], [where, "container.ipc"]]
    assert "'16gb' is not a size such as 16g" in found.problems[0]
    assert "not an accelerator or RDMA device" in found.problems[4] and "container.device_patterns" in found.problems[4]
    assert found.passed == [] and all("\n" not in p for p in found.problems)
    manifest["container"].update(shm_size="16g", ulimits={"memlock": -1, "nofile": 1048576}, ipc="host",
                                 device_patterns=["/dev/acme*"])
    path.write_text(yaml.safe_dump(manifest))
    fixed = Findings()
    _check_container(Vendor(manifest=load_vendor_manifest(path), location=str(folder)), fixed)
    assert fixed.problems == [] and fixed.passed == [f"container options {where}"]


def test_a_dockerfile_without_a_base_is_a_problem(tmp_path: Path) -> None:
    from flagperf.hosts.vendorscaffold import write_vendor_folder

    folder = write_vendor_folder(tmp_path, "acme")
    dockerfile = folder / "pytorch" / "Dockerfile"
    dockerfile.write_text("\n".join(line for line in dockerfile.read_text().splitlines()
                                    if not line.startswith("FROM")) + "\n")
    found = Findings()
    _check_image(Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=str(folder)), found)
    assert found.problems == [f"{display_path(dockerfile)}: no FROM line: the build has no base image (the vendor's "
                              "PyTorch image)"]


def test_an_errors_findings_are_told_apart_by_what_they_say_and_the_count_names_the_file() -> None:
    """Two findings whose lines shorten alike (different files deep in a lab) are two problems, not one; the count
    of findings left out names the error's file from its own field, not from its line cut at the first ': ' (a
    folder named 'a: b' gave 'a')."""
    from flagperf.errors import MAX_FINDINGS, ConfigError, gathered

    first, second = (ConfigError(f"/lab/{'configs/' * 40}{name}/{'configs/' * 40}case.yaml", "size", "too big")
                     for name in ("one", "two"))
    found = Findings()
    found.add_error(gathered([first, second]))
    assert found.problems == [str(first), str(second)] and str(first) == str(second)
    source = "/lab/a: b/vendor.yaml"
    found = Findings()
    found.add_error(gathered([ConfigError(source, f"k{i}", "bad") for i in range(MAX_FINDINGS + 2)]))
    assert found.problems[-1] == f"{source}: ... and 2 more findings (not listed: fix these and check again)"


def test_a_folder_not_installed_here_is_judged_by_its_own_implementations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vendor check <folder>` of a vendor not installed here (or shadowed) read the case's implementations
    against the installed vendor of the name: acme's own operation/comp was "unknown", and whether comp reads
    inductor_mode was never asked of acme's engine.yaml. The folder's own implementations are read now."""
    from flagperf.config.cases import load_case
    from flagperf.hosts.vendorcheck import _check_case

    folder = tmp_path / "vendors" / "acme"
    shutil.copytree(PROJECT_ROOT / "vendor_images" / "cpu", folder)
    (folder / MANIFEST).write_text((folder / MANIFEST).read_text().replace("name: cpu", "name: acme", 1))
    comp = folder / "operation" / "comp"
    comp.mkdir()
    (comp / "engine.yaml").write_text("name: comp\ndescription: compiled\nmodule: flagperf.operation.compiled\n"
                                      "options: [inductor_mode]\n")
    case_folder = tmp_path / "cases" / "operation" / "op-gemm"
    (case_folder / "vendor").mkdir(parents=True)
    text = (PROJECT_ROOT / "cases" / "operation" / "op-gemm" / "case.yaml").read_text()
    (case_folder / "case.yaml").write_text(text.replace("  inductor_mode: default", "  inductor_mode: max-autotune"))
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(case_folder.parent.parent))
    vendor = Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=str(folder))
    case = load_case("op-gemm", {"op-gemm": case_folder})
    for chosen, problem in (("[comp]", None),
                            # acme's native does not compile: the mode would change nothing, said of acme.yaml
                            ("[native]", "implementations: none of native")):
        (case_folder / "vendor" / "acme.yaml").write_text(f"implementations: {chosen}\n")
        found = Findings()
        used = _check_case(vendor, case, found)
        if problem is None:
            assert used == ["overrides acme.yaml"] and found.problems == [], found.problems
        else:
            assert len(found.problems) == 1 and problem in found.problems[0] and "acme.yaml" in found.problems[0], \
                found.problems
    # implementations: null (every one of acme's) is judged by acme's own folders too, as a list is: with comp it
    # compiles; without acme's compiling folders the mode would change nothing (the installed cpu's compile is not
    # acme's)
    (case_folder / "vendor" / "acme.yaml").write_text("seed: 7\n")
    for drop, problem in (((), None), (("comp", "compile"), "none of the implementations compared (native) reads it")):
        for name in drop:
            shutil.rmtree(folder / "operation" / name)
        found = Findings()
        used = _check_case(vendor, case, found)
        if problem is None:
            assert used == ["overrides acme.yaml"] and found.problems == [], found.problems
        else:
            assert len(found.problems) == 1 and problem in found.problems[0], found.problems
    # `flagperf validate` of the file acme keeps in its own folder of the case judges it by acme's folders too, as
    # vendor check does (it read comp against the installed vendors: "unknown implementations 'comp'")
    kept = folder / "cases" / "operation" / "op-gemm" / "acme.yaml"
    kept.parent.mkdir(parents=True)
    kept.write_text("implementations: [comp]\n")
    comp.mkdir()  # dropped above
    (comp / "engine.yaml").write_text("name: comp\ndescription: compiled\nmodule: flagperf.operation.compiled\n"
                                      "options: [inductor_mode]\n")
    monkeypatch.delenv("FLAGPERF_CASE_PATH")  # the shipped op-gemm: one case of the name
    from flows.cli import _validate_file

    assert _validate_file(kept) == "vendor overrides of op-gemm (vendor acme's folder)"


@pytest.mark.parametrize("text", ["", "# X1: figures to come\n"], ids=["empty", "comments-only"])
def test_a_datasheets_yaml_that_lists_nothing_is_a_problem_naming_it(tmp_path: Path, text: str) -> None:
    """An empty datasheets.yaml (or one of comments only) passed vendor check, and the shipped spec.py that reads it
    stops on it; one with no file at all is no finding (the convention is the vendor's choice)."""
    from flagperf.hosts.vendorcheck import _check_peaks

    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    vendor = Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=str(folder))
    absent = Findings()
    _check_peaks(vendor, absent)
    assert absent.problems == []
    (folder / "datasheets.yaml").write_text(text)
    found = Findings()
    _check_peaks(vendor, found)
    assert found.problems == [f"{display_path(folder / 'datasheets.yaml')}: lists no datasheet entries (empty, or "
                              "comments only): a list of entries, each with its source; or remove the file if the "
                              "vendor's spec.py reads none"]


def test_the_packages_an_install_step_names_and_the_scales_a_case_readme_names_are_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlagPerf's guide keeps what <framework>_install.sh installs in packages/ beside it, and asks a README per case
    that matches the code; neither was looked at: a missing package failed the build on the host, a README's 1x8
    results named a scale file the folder did not ship. Each named path of packages/ is now looked for in the build
    context (a glob needs a match; one leading out is named so), and each scale file a case adaptation's README
    names in its folder (.yaml or FlagPerf's .py)."""
    from flagperf.config.cases import available_cases, load_case
    from flagperf.hosts.vendorcheck import _check_case

    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    context = folder / "pytorch"
    (context / "packages" / "wheels").mkdir(parents=True)
    (context / "packages" / "wheels" / "acme_torch-1.0-py3-none-any.whl").write_text("wheel\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY install.sh packages /opt/\n"
                                        "RUN pip install ./packages/wheels/*.whl  # packages/not-this.run\n"
                                        "RUN sh /opt/install.sh\n")
    (context / "install.sh").write_text("#!/bin/sh\nsh packages/acme-driver.run --silent\n"
                                        "pip install packages/../../spec.py \"$PKGS/packages/x\" /opt/packages/y\n")
    manifest = load_vendor_manifest(folder / MANIFEST)
    vendor = Vendor(manifest=manifest, location=str(folder))
    found = Findings()
    _check_image(vendor, found)
    script, shown = display_path(context / "install.sh"), display_path(context)
    assert found.problems == [
        f"{script}: line 2: names packages/acme-driver.run, which is not in {shown} (FlagPerf's packages/ goes beside "
        "the Dockerfile)",
        f"{script}: line 3: names packages/../../spec.py, which leads out of {shown} (the build sees only its own "
        "folder)"], found.problems
    assert found.passed == []
    wheel = context / "packages" / "wheels" / "acme_torch-1.0-py3-none-any.whl"
    assert validate_findings(wheel) == found.problems  # validate of a file of packages/ says the same
    (context / "packages" / "acme-driver.run").write_text("driver\n")
    (context / "install.sh").write_text("#!/bin/sh\nsh packages/acme-driver.run --silent\n")
    fixed = Findings()
    _check_image(vendor, fixed)
    assert fixed.problems == [] and fixed.passed == [f"image {display_path(context / 'Dockerfile')} with install.sh"]
    assert validate_findings(wheel) == []

    cases = tmp_path / "cases"
    shutil.copytree(FIXTURE / "cases", cases)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path))  # validate finds the vendor's <hw> as a run would
    adapted = cases / "training" / "adapted-mlp" / "vendor" / "testvendor"
    (adapted / "config_testvendorx1x1.yaml").write_text("{}\n")
    readme = adapted / "README.md"
    readme.write_text("| scale | file | samples/s |\n|---|---|---|\n| 1x1 | config_testvendorx1x1.py | 10 |\n"
                      "| 1x8 | config_testvendorx1x8.py | 80 |\n| 2x8 | `config_testvendorx2x8.yaml` | 150 |\n")
    case = load_case("adapted-mlp", available_cases())
    found = Findings()
    _check_case(vendor, case, found)
    tail = ("the results it reports at that scale are not reproducible from the folder; add the file or correct the "
            "README")
    assert [p for p in found.problems if p.startswith(display_path(readme))] == [
        f"{display_path(readme)}: names {name}, which {display_path(adapted)} does not have ({stem}.yaml or .py): "
        f"{tail}" for name, stem in (("config_testvendorx1x8.py", "config_testvendorx1x8"),
                                     ("config_testvendorx2x8.yaml", "config_testvendorx2x8"))], found.problems
    assert validate_findings(readme) == [p for p in found.problems if p.startswith(display_path(readme))]
    (adapted / "config_testvendorx1x8.py").write_text("lr = 0.1\n")
    (adapted / "config_testvendorx2x8.yaml").write_text("{}\n")
    assert validate_findings(readme) == []


def validate_findings(path: Path) -> list[str]:
    """`flagperf validate`'s lines of one file (its check, in this process), [] where it passes."""
    from flagperf.errors import FlagperfError, findings
    from flows.cli import _check_file

    try:
        _check_file(path, [])
    except FlagperfError as exc:
        return [str(finding) for finding in findings(exc)]
    return []


def _image_findings(tmp_path: Path, dockerfile: str, script: str | None = None,
                    files: tuple[str, ...] = ()) -> tuple[Findings, Path]:
    """_check_image of the test vendor whose pytorch/ folder has this Dockerfile (and install.sh, and these files)."""
    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    context = folder / "pytorch"
    (context / "Dockerfile").write_text(dockerfile)
    if script is None:
        (context / "install.sh").unlink()
    else:
        (context / "install.sh").write_text(script)
    for name in files:
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text("x\n")
    found = Findings()
    _check_image(Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=str(folder)), found)
    return found, context


def test_a_packages_path_the_build_writes_itself_is_not_missing(tmp_path: Path) -> None:
    """FlagPerf's guide has install scripts fetch what they install into packages/: a path the build makes (mkdir,
    a redirection, tar -C, cp's or mv's destination, pip download -d) was said to be missing from the folder. It is
    not looked for now, nor anything under it; one the build does not write still is. Where the build downloads
    anything, a path not found may be one of the downloads: a note, not a problem."""
    script = ("#!/bin/sh\nmkdir -p packages/build\necho done > packages/build/x.log\n"
              "tar -C packages/src -xzf /tmp/src.tgz && sh packages/src/acme/setup.sh\n"
              "cp /tmp/driver.run packages/driver.run; sh packages/driver.run\n"
              "mv /tmp/w packages/wheels && pip install packages/wheels/*.whl\n"
              "sh packages/missing.run\n")
    dockerfile = "FROM scratch\nCOPY install.sh /opt/\nRUN sh /opt/install.sh >packages/install.log\n"
    found, context = _image_findings(tmp_path, dockerfile, script)
    assert found.problems == [f"{display_path(context / 'install.sh')}: line 7: names packages/missing.run, which is "
                              f"not in {display_path(context)} (FlagPerf's packages/ goes beside the Dockerfile)"], \
        found.problems
    downloading = ("#!/bin/sh\npip download -d /tmp/w acme-torch\ncd packages && wget https://example.com/acme.run\n"
                   "sh packages/acme.run\nwget -P packages/dl/ https://example.com/b.run && sh packages/dl/b.run\n")
    found, context = _image_findings(tmp_path / "2", dockerfile, downloading)
    assert found.problems == [] and found.notes == [
        # the script's cd packages holds for its next lines too, as in bash
        f"{display_path(context / 'install.sh')}: line 4: names packages/acme.run (packages/packages/acme.run after "
        f"cd packages), which is not in "
        f"{display_path(context)}: the build downloads files (wget, curl, pip download), so it may be one of them; if "
        "not, FlagPerf's packages/ goes beside the Dockerfile"], (found.problems, found.notes)


def test_a_packages_path_a_copy_step_or_an_unknown_place_may_hold_is_not_a_problem(tmp_path: Path) -> None:
    """A COPY's destination (COPY --from=an image's packages to WORKDIR's packages/, COPY sdkdir/ packages/) was
    not counted as written, and an archive unpacked where the check cannot tell (tar x without -C, ADD of an
    archive, unzip without -d) gave "names packages/..., which is not in ..." for a build that works: the first is
    written now, the second a note. A Dockerfile with none of these still has the problem."""
    from_image = ("FROM scratch\nCOPY --from=acme/sdk:1.0 /opt/sdk/packages /workspace/packages\n"
                  "WORKDIR /workspace\nRUN pip install packages/*.whl\n")
    found, _ = _image_findings(tmp_path / "1", from_image)
    assert found.problems == [], found.problems
    for number, dockerfile in enumerate(("FROM scratch\nCOPY sdkdir/ packages/\nRUN sh packages/sdk.run\n",
                                         "FROM scratch\nWORKDIR /w\nCOPY sdk /w/packages/sdk\n"
                                         "RUN sh packages/sdk/sdk.run\n")):
        found, _ = _image_findings(tmp_path / f"c{number}", dockerfile, files=("sdkdir/sdk.run", "sdk/sdk.run"))
        assert found.problems == [] and found.notes == [], (dockerfile, found.problems, found.notes)
    for number, dockerfile in enumerate(("FROM scratch\nCOPY sdk.tar.gz /w/\nRUN tar xf sdk.tar.gz && bash "
                                         "packages/sdk.run\n",
                                         "FROM scratch\nADD sdk.tar.gz /w/\nRUN bash packages/sdk.run\n",
                                         "FROM scratch\nCOPY sdk.zip /w/\nRUN unzip sdk.zip; bash packages/sdk.run\n")):
        found, context = _image_findings(tmp_path / f"u{number}", dockerfile, files=("sdk.tar.gz", "sdk.zip"))
        assert found.problems == [] and found.notes == [
            f"{display_path(context / 'Dockerfile')}: line 3: names "
            f"packages/sdk.run, which is not in {display_path(context)}: the build writes files where this check "
            "cannot tell (COPY --from, ADD of a URL or an archive, tar x without -C, unzip without -d), so it may "
            "be one of them; if not, FlagPerf's packages/ goes beside the Dockerfile"], \
            (dockerfile, found.problems, found.notes)
    plain = ("FROM scratch\nCOPY sdk.tar.gz /w/sdk.tar.gz\nWORKDIR /w\nRUN tar -C /opt -xf sdk.tar.gz && "
             "unzip -d /opt sdk.zip && pip install packages/x.whl\n")
    found, context = _image_findings(tmp_path / "plain", plain, files=("sdk.tar.gz", "sdk.zip"))
    assert found.problems == [f"{display_path(context / 'Dockerfile')}: line 4: names packages/x.whl, which is not "
                              f"in {display_path(context)} (FlagPerf's packages/ goes beside the Dockerfile)"], \
        found.problems


def test_what_a_copy_step_copies_is_read_in_both_forms_and_as_a_glob(tmp_path: Path) -> None:
    """The COPY check split the line at blanks: COPY ["sdk", "/w/sdk"] was said to copy '["sdk",', COPY *.sh and
    ADD of a URL named files the context cannot have. Docker's JSON form is read as JSON, a source is a glob that
    needs one match, a URL and another stage's files are not the context's; a file the context lacks still is."""
    dockerfile = ('FROM scratch\nCOPY ["sdk", "/w/sdk"]\nCOPY --chown=1:1 ["setup.sh", "/w/"]\nCOPY *.sh /opt/\n'
                  "ADD https://example.com/x.tar.gz /opt/\nCOPY --from=build /out /w/out\nRUN sh /opt/setup.sh\n")
    found, context = _image_findings(tmp_path / "ok", dockerfile, files=("sdk/a.run", "setup.sh"))
    assert found.problems == [], found.problems
    found, context = _image_findings(tmp_path / "missing", 'FROM scratch\nCOPY ["gone.sh", "/w/"]\nCOPY *.run /w/\n'
                                     "RUN true\n")
    shown = display_path(context)
    assert found.problems == [f"{display_path(context / 'Dockerfile')}: line {n}: copies {name}, which is not in "
                              f"{shown}" for n, name in ((2, "gone.sh"), (3, "*.run"))], found.problems


def test_a_variable_in_a_packages_name_is_a_glob(tmp_path: Path) -> None:
    """packages/acme_torch-${VER}-py3-none-any.whl was read as packages/acme_torch- (cut at the $) and said missing
    though the wheel was there. Each $VAR or ${VAR} is now any text (a glob that needs one match); a name the shell
    alone decides ($(...), ${VAR:-x}) is not judged."""
    script = ("#!/bin/sh\npip install packages/acme_torch-${VER}-py3-none-any.whl \"packages/acme_$KIND.run\"\n"
              "sh packages/acme-$(uname -m).run packages/x-${V:-1}.run\nsh packages/acme_driver-${VER}.run\n")
    found, context = _image_findings(tmp_path, "FROM scratch\nCOPY install.sh /opt/\nRUN sh /opt/install.sh\n",
                                     script, ("packages/acme_torch-1.0-py3-none-any.whl", "packages/acme_gpu.run"))
    script_name = display_path(context / "install.sh")
    assert found.problems == [f"{script_name}: line 4: names packages/acme_driver-${{VER}}.run, "
                              f"which is not in {display_path(context)} (FlagPerf's packages/ goes beside the "
                              "Dockerfile)"], found.problems


def test_two_variables_side_by_side_in_a_packages_name_are_one_glob(tmp_path: Path) -> None:
    """packages/torch-${VER}${CUDA}.whl was the glob packages/torch-**.whl, which pathlib refuses (** only as a
    whole path component): vendor check and validate ended in a traceback. Runs of * are one * now."""
    found, _ = _image_findings(tmp_path, "FROM scratch\nRUN pip install packages/torch-${VER}${CUDA}.whl\n", None,
                               ("packages/torch-2.1cu121.whl",))
    assert (found.problems, found.not_checkable) == ([], []), (found.problems, found.not_checkable)


def test_a_very_long_line_is_split_at_blanks_not_by_the_shell_grammar() -> None:
    """shlex takes time quadratic in a word's length: one 1.6 MB word in an install script (files may be 16 MiB)
    kept vendor check busy for minutes. A logical line over SHLEX_LIMIT is split at blanks (quotes stay on)."""
    short = "pip install 'packages/a b.whl'"
    assert shell_words(short) == ["pip", "install", "packages/a b.whl"]
    long = short + " x" * SHLEX_LIMIT
    assert shell_words(long)[:4] == ["pip", "install", "'packages/a", "b.whl'"]


def test_an_exec_form_run_is_read_as_its_words(tmp_path: Path) -> None:
    """RUN ["pip", "install", "packages/x.whl"] was read as shell text: it named packages/x.whl", (quote and bracket
    included) and was said missing though the wheel was there. Its JSON words are the command now, a shell's -c
    script that script."""
    dockerfile = ('FROM scratch\nRUN ["pip", "install", "packages/x.whl"]\n'
                  'RUN ["/bin/bash", "-c", "pip install packages/*.whl && sh packages/missing.run"]\n')
    found, context = _image_findings(tmp_path, dockerfile, None, ("packages/x.whl",))
    assert found.problems == [f"{display_path(context / 'Dockerfile')}: line 3: names packages/missing.run, which is "
                              f"not in {display_path(context)} (FlagPerf's packages/ goes beside the Dockerfile)"], \
        found.problems


def test_run_flags_are_not_the_command(tmp_path: Path) -> None:
    """RUN --mount=... wget -P packages URL was read with --mount=... as the command: the download into packages/
    went unseen and what it fetched was said missing. RUN's own --flag[=value] words are dropped first now."""
    dockerfile = ("FROM scratch\nRUN --mount=type=cache,target=/root/.cache wget -P packages https://example.com/a.run"
                  " && sh packages/a.run\nRUN --network=host pip download -d wheels torch\n"
                  "RUN --network=host [\"pip\", \"install\", \"packages/x.whl\"]\n")
    found, context = _image_findings(tmp_path, dockerfile, None, ("packages/x.whl",))
    where = display_path(context / "Dockerfile")
    assert found.problems == [  # the options themselves are the engine's builder's problem, each said as Docker does
        f"{where}: line 2: RUN --mount=type=cache,target=/root/.cache: \"the --mount option requires BuildKit\": "
        f"{CLASSIC_BUILDER}; drop it and COPY what it mounts",
        *(f"{where}: line {number}: RUN --network=host: \"the --network option requires BuildKit\": {CLASSIC_BUILDER}; "
          "drop it: the engine builds with network_mode=\"host\" already, so it loses nothing" for number in (3, 4))]
    assert found.notes == [], found.notes


def test_copy_chmod_is_refused_by_the_engine_builder_and_copy_chown_is_not(tmp_path: Path) -> None:
    """COPY --chmod and ADD --chmod passed: Docker's classic builder, the engine's, refuses them ("the --chmod option
    requires BuildKit"). --chown and --from it has."""
    dockerfile = ("FROM scratch\nCOPY --chmod=755 a.sh /a.sh\nADD --chown=1:1 --chmod=644 a.sh /b.sh\n"
                  "COPY --chown=1:1 a.sh /c.sh\nRUN sh /a.sh\n")
    found, context = _image_findings(tmp_path, dockerfile, None, ("a.sh",))
    where = display_path(context / "Dockerfile")
    assert found.problems == [
        f"{where}: line {number}: {keyword} --chmod={mode}: \"the --chmod option requires BuildKit\": "
        f"{CLASSIC_BUILDER}; drop it and RUN chmod the file after the {keyword}"
        for number, keyword, mode in ((2, "COPY", 755), (3, "ADD", 644))]


def test_a_quoted_or_shifted_double_less_than_is_no_heredoc(tmp_path: Path) -> None:
    """A << in quotes, in $(( )) or in the exec form was taken for a heredoc: a false problem, and every line after it
    was read as its body, so a missing COPY further on went unsaid. Only an unquoted word starting with << opens one
    now."""
    dockerfile = ("FROM scratch\nRUN printf 'int main(){std::cout << \"hi\";}' > t.cpp\nRUN echo $((1<<N))\n"
                  "RUN sed -i 's/x << y/z/' f\nRUN echo \"use cat <<EOF\"\nRUN [\"bash\", \"-c\", \"cat <<EOF\"]\n"
                  "RUN cat <<<word\nCOPY missing.txt /x\nRUN cat 2<<A\nsh packages/a.run\nA\n")
    found, context = _image_findings(tmp_path, dockerfile)
    where = display_path(context / "Dockerfile")
    assert found.problems == [heredoc_problem(context / "Dockerfile", 9, "<<A"),
                              f"{where}: line 8: copies missing.txt, which is not in {display_path(context)}"], \
        found.problems


def test_a_write_to_a_variable_does_not_switch_the_check_off(tmp_path: Path) -> None:
    """mkdir -p $WORKDIR recorded the written place *, which matched every path (a * crossing /): no packages/ path
    was looked for any more. A place whose first component the shell decides is not counted now, and a * in one
    stands for one path component."""
    script = ("#!/bin/sh\nmkdir -p $WORKDIR\necho x > $LOG\ncp a ${DEST}\ntouch packages/$NAME.run\n"
              "sh packages/missing.sh packages/sub/missing.run\n")
    found, context = _image_findings(tmp_path, "FROM scratch\nCOPY install.sh /opt/\nRUN sh /opt/install.sh\n",
                                     script)
    assert found.problems == [f"{display_path(context / 'install.sh')}: line 6: names packages/{name}, which is not "
                              f"in {display_path(context)} (FlagPerf's packages/ goes beside the Dockerfile)"
                              for name in ("missing.sh", "sub/missing.run")], found.problems


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    """A Dockerfile saved with a UTF-8 BOM had no FROM line (its first keyword was \\ufeffFROM), and an install
    script's first command was not known (\\ufeffmkdir). The BOM is dropped now."""
    found, _ = _image_findings(tmp_path, "\ufeffFROM scratch\nCOPY install.sh /opt/\nRUN sh /opt/install.sh\n",
                               "\ufeffmkdir -p packages/build\nsh packages/build/x.run\n")
    assert found.problems == [], found.problems


def test_a_heredoc_fed_to_a_command_is_data_not_shell(tmp_path: Path) -> None:
    """RUN cat <<EOF > /etc/pip.conf had its body read as shell: find-links = packages/wheels was said missing. Only
    a heredoc that is the script itself (RUN <<EOF, RUN bash <<EOF) is read as shell now. The engine's builder has
    no heredocs at all (Docker's classic one): each is a problem of its own, saying so."""
    dockerfile = ("FROM scratch\nRUN cat <<EOF > /etc/pip.conf\n[global]\nfind-links = packages/wheels\nEOF\n"
                  "RUN bash -e <<EOF\npip install packages/missing.whl\nEOF\n")
    found, context = _image_findings(tmp_path, dockerfile)
    where = display_path(context / "Dockerfile")
    assert found.problems == [
        *(heredoc_problem(context / "Dockerfile", number, "<<EOF") for number in (2, 6)),
        f"{where}: line 6: names packages/missing.whl, which is not in {display_path(context)} (FlagPerf's packages/ "
        "goes beside the Dockerfile)"], found.problems


def test_the_dockerfile_is_read_as_docker_joins_its_instructions(tmp_path: Path) -> None:
    """Only a physical line starting with RUN was read: a continuation line, a heredoc's body and a lower-case run
    were never looked at, and a # inside quotes cut the name. Each instruction is now read whole (continuations
    joined, comment lines inside dropped, heredoc bodies with it), said at its first line."""
    dockerfile = ("FROM scratch\nrun pip install \\\n  # the wheel\n    packages/missing-a.whl\n"
                  "RUN pip install \"packages/has#hash.whl\"  # packages/comment.whl\n"
                  "RUN <<EOF\npip install packages/missing-b.whl\nEOF\n")
    found, context = _image_findings(tmp_path, dockerfile, None, ("packages/has#hash.whl",))
    where, shown = display_path(context / "Dockerfile"), display_path(context)
    named = [line for line in found.problems if "classic builder" not in line]  # RUN <<EOF is also one of those
    assert named == [f"{where}: line {number}: names packages/{name}, which is not in {shown} (FlagPerf's packages/ "
                     "goes beside the Dockerfile)" for number, name in ((2, "missing-a.whl"), (6, "missing-b.whl"))], \
        found.problems


def test_an_install_script_is_read_only_as_a_regular_file_in_its_folder(tmp_path: Path) -> None:
    """An install script that is a link out of the folder was read through it, pieces of the file there quoted; one
    that is not text was a problem of the vendor folder. A link is left to the link scans now; a file that cannot
    be read as text is not checkable here."""
    outside = tmp_path / "elsewhere.sh"
    outside.write_text("sh packages/secret-name.run\n")
    _, context = _image_findings(tmp_path, "FROM scratch\nCOPY install.sh /opt/\nRUN sh /opt/install.sh\n",
                                 "x\n")
    (context / "install.sh").unlink()
    (context / "install.sh").symlink_to(outside)
    linked = Findings()
    _check_image(Vendor(manifest=load_vendor_manifest(context.parent / MANIFEST), location=str(context.parent)),
                 linked)
    assert not any("secret-name" in line for line in linked.problems + linked.notes + linked.not_checkable), linked
    (context / "install.sh").unlink()
    (context / "install.sh").write_bytes(b"\xff\xfe packages/x\n")
    binary = Findings()
    _check_image(Vendor(manifest=load_vendor_manifest(context.parent / MANIFEST), location=str(context.parent)),
                 binary)
    assert binary.problems == [] and binary.not_checkable == [
        f"{display_path(context / 'install.sh')}: the packages/ paths it names are not checked (not UTF-8 text)"], \
        binary


def test_the_image_ok_line_depends_on_this_dockerfile_s_problems_alone(tmp_path: Path) -> None:
    """With container.dockerfile: Dockerfile the build context is the vendor folder, and any earlier problem of a
    file in it (vendor.yaml's, a monitor's) took the image's ok line away. Only the Dockerfile's check counts now."""
    from flagperf.hosts.vendorcheck import _check_dockerfile

    folder = tmp_path / "acme"
    folder.mkdir()
    (folder / "Dockerfile").write_text("FROM scratch\nRUN true\n")
    found = Findings(problems=[f"{display_path(folder / MANIFEST)}: container.shm_size: too small"])
    _check_dockerfile(folder / "Dockerfile", found)
    assert found.passed == [f"image {display_path(folder / 'Dockerfile')}"], found


def test_a_case_readme_is_held_to_the_scale_files_of_this_vendor_s_hardware_it_names_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case README's scale names were all held to the folder: a URL to FlagPerf's file, NVIDIA's file it compares
    with, a path elsewhere were said missing, while a name in Chinese prose was never seen (no word boundary next to
    a CJK letter); every family's README was read, every README* file (README.bak too), and one that is a link out
    was read through it. Now: names of the vendor's hardware, bare or under ./ or config/, in a training case's
    README, README.md, README_CN.md ...; a link is the link scans', a README not readable as text not checkable."""
    from flagperf.config.cases import available_cases, load_case
    from flagperf.hosts.vendorcheck import _check_case, readme_scale_findings

    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    vendor = Vendor(manifest=load_vendor_manifest(folder / MANIFEST), location=str(folder))
    cases = tmp_path / "cases"
    shutil.copytree(FIXTURE / "cases", cases)
    base = cases / "base" / "readme-gemm"
    base.mkdir(parents=True)
    (base / "case.yaml").write_text((PROJECT_ROOT / "cases" / "base" / "computation-FP32" / "case.yaml").read_text()
                                    .replace("name: computation-FP32", "name: readme-gemm"))
    (base / "vendor" / "testvendor").mkdir(parents=True)
    (base / "vendor" / "testvendor" / "README.md").write_text("| 1x8 | config_testvendorx1x8.py |\n")
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    adapted = cases / "training" / "adapted-mlp" / "vendor" / "testvendor"
    (adapted / "config_testvendorx1x1.yaml").write_text("{}\n")
    (adapted / "README.md").write_text(
        "From [FlagPerf](https://github.com/FlagOpen/FlagPerf/blob/main/training/x/config_testvendorx1x8.py), "
        "compared with NVIDIA's config_A100x1x8.py and ../other/config_testvendorx2x4.py.\n"
        "1x1: config/config_testvendorx1x1.py; 1x4: ./config_testvendorx1x4.yaml\n"
        "2x8 的配置为config_testvendorx2x8.py中所写。\n")
    (adapted / "README_CN.md").write_text("4x8: `config_testvendorx4x8.py`\n")
    (adapted / "README.bak").write_text("config_testvendorx8x8.py\n")
    found = Findings()
    _check_case(vendor, load_case("readme-gemm", available_cases()), found)  # not a training case: not read
    for error in readme_scale_findings(adapted, "testvendor", found):  # what _check_case of adapted-mlp runs
        found.add_error(error)
    tail = ("the results it reports at that scale are not reproducible from the folder; add the file or correct the "
            "README")
    assert [p for p in found.problems if "README" in p] == [
        f"{display_path(adapted / readme)}: names {name}, which {display_path(adapted)} does not have ({stem}.yaml or "
        f".py): {tail}" for readme, name, stem in (
            ("README.md", "config_testvendorx1x4.yaml", "config_testvendorx1x4"),
            ("README.md", "config_testvendorx2x8.py", "config_testvendorx2x8"),
            ("README_CN.md", "config_testvendorx4x8.py", "config_testvendorx4x8"))], found.problems
    outside = tmp_path / "elsewhere.md"
    outside.write_text("config_testvendorx3x8.py\n")
    (adapted / "README_CN.md").unlink()
    (adapted / "README_CN.md").symlink_to(outside)
    (adapted / "README.md").write_bytes(b"\xff config_testvendorx5x8.py\n")
    found = Findings()
    for error in readme_scale_findings(adapted, "testvendor", found):  # the link is the link scans', not read
        found.add_error(error)
    assert found.problems == [] and found.not_checkable == [
        f"{display_path(adapted / 'README.md')}: the scale files it names are not checked (not UTF-8 text)"], found


def _validated(path: Path) -> tuple[list[str], list[str]]:
    """`flagperf validate`'s finding lines and notes of one file (its check, in this process)."""
    from flagperf.errors import FlagperfError, findings
    from flows.cli import _check_file

    notes: list[str] = []
    try:
        _check_file(path, notes)
    except FlagperfError as exc:
        return [str(finding) for finding in findings(exc)], notes
    return [], notes


def test_validate_of_a_packages_file_scans_the_links_first_and_reads_nothing_through_them(tmp_path: Path) -> None:
    """validate of a file of packages/ skipped the link scans vendor check runs first: a wheel that is a link to
    /etc/hostname was ok, and an install script that is a link out of the folder was read and its names quoted. The
    build context's links are scanned first now; a script is read only inside it. The Dockerfile is any one vendor
    check checks: container.dockerfile by its own name (img/Dockerfile.acme) too."""
    folder = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    context = folder / "pytorch"
    (context / "packages").mkdir()
    wheel = context / "packages" / "a.whl"
    wheel.write_text("wheel\n")
    (context / "packages" / "out.whl").symlink_to("/etc/hostname")
    errors, _ = _validated(wheel)
    assert errors == [f"{display_path(context / 'packages' / 'out.whl')}: links to /etc/hostname by its absolute "
                      "path: where the vendor folder is at another path (a clone of it, a host's copy, a round's "
                      "container) it leads nowhere; make the link relative, to a file inside the vendor folder, or "
                      "copy the file"], errors
    (context / "packages" / "out.whl").unlink()
    outside = tmp_path / "elsewhere.sh"
    outside.write_text("sh packages/secret-name.run\n")
    (context / "install.sh").unlink()
    (context / "install.sh").symlink_to(os.path.relpath(outside, context))  # relative, out of the vendor folder
    errors, notes = _validated(wheel)
    assert errors and not any("secret-name" in line for line in errors + notes), (errors, notes)
    (context / "install.sh").unlink()
    (context / "install.sh").write_text("sh packages/a.whl\n")
    manifest = folder / MANIFEST
    (folder / "img").mkdir()
    (folder / "img" / "Dockerfile.acme").write_text("FROM scratch\nRUN pip install packages/b.whl packages/c.whl\n")
    (folder / "img" / "packages").mkdir()
    (folder / "img" / "packages" / "b.whl").write_text("wheel\n")
    manifest.write_text(manifest.read_text().replace("dockerfile: pytorch/Dockerfile",
                                                     "dockerfile: img/Dockerfile.acme"))
    assert "img/Dockerfile.acme" in manifest.read_text()
    errors, _ = _validated(folder / "img" / "packages" / "b.whl")
    assert errors == [f"{display_path(folder / 'img' / 'Dockerfile.acme')}: line 2: names packages/c.whl, which is "
                      f"not in {display_path(folder / 'img')} (FlagPerf's packages/ goes beside the Dockerfile)"
                      ], errors


def test_validate_of_a_case_readme_reads_that_readme_alone_and_none_through_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """validate of one README of a case adaptation said every README's problems, and read a README* that is a link
    out of the folder (quoting the file there). It reads the README given now, and one that is a link is not read:
    a note says its scale files are not checked."""
    shutil.copytree(FIXTURE / "vendors" / "testvendor", tmp_path / "vendors" / "testvendor")
    monkeypatch.setenv("FLAGPERF_VENDOR_PATH", str(tmp_path / "vendors"))
    cases = tmp_path / "cases"
    shutil.copytree(FIXTURE / "cases", cases)
    monkeypatch.setenv("FLAGPERF_CASE_PATH", str(cases))
    adapted = cases / "training" / "adapted-mlp" / "vendor" / "testvendor"
    (adapted / "README.md").write_text("1x8: config_testvendorx1x8.py\n")
    (adapted / "README_CN.md").write_text("2x8: config_testvendorx2x8.py\n")
    outside = tmp_path / "elsewhere.md"
    outside.write_text("4x8: config_testvendorx4x8.py\n")
    (adapted / "README_EN.md").symlink_to(outside)
    errors, _ = _validated(adapted / "README.md")
    assert errors == [f"{display_path(adapted / 'README.md')}: names config_testvendorx1x8.py, which "
                      f"{display_path(adapted)} does not have (config_testvendorx1x8.yaml or .py): the results it "
                      "reports at that scale are not reproducible from the folder; add the file or correct the README"
                      ], errors
    errors, notes = _validated(adapted / "README_EN.md")
    assert errors == [] and notes == [
        f"{display_path(adapted / 'README_EN.md')}: a link, not read (the vendor folder's link scans say where it "
        "leads); the scale files it names are not checked"], (errors, notes)


def test_an_install_script_the_dockerfile_never_runs_says_how_to_run_it(tmp_path: Path) -> None:
    """FlagPerf runs docker_image/<framework>/<framework>_install.sh itself, after its build; this engine builds the
    Dockerfile alone, so every folder brought from FlagPerf was told the script "is beside the Dockerfile but the
    Dockerfile never uses it", without why or what to do. The line says both now, and what it says to add passes;
    a comment naming the script runs nothing, so it is no use of it."""
    framework_script = "pytorch_install.sh"
    found, context = _image_findings(tmp_path / "unused", "FROM scratch\n# RUN bash pytorch_install.sh\nRUN true\n",
                                     None, (framework_script,))
    assert found.problems == [
        f"{display_path(context / 'Dockerfile')}: {framework_script} is beside the Dockerfile, which never runs it: "
        "FlagPerf runs it in a container of the built image and commits that, here the image is the Dockerfile's "
        "build alone; add `COPY . /workspace/docker_image/` and `RUN cd /workspace/docker_image && bash "
        f"{framework_script}` (FlagPerf's path, which its scripts name) to the Dockerfile, or remove the script"
        ], found.problems
    assert validate_findings(context / framework_script) == found.problems  # validate of the script says the same
    added = (f"FROM scratch\nCOPY . /workspace/docker_image/\nRUN cd /workspace/docker_image && bash "
             f"{framework_script}\n")
    found, context = _image_findings(tmp_path / "added", added, None, (framework_script,))
    assert found.problems == [] and validate_findings(context / framework_script) == [], found.problems
    # FlagPerf's scripts name the folder where it has it: with the lines it says to add, what a cd there runs from
    # packages/ is looked for, in the Dockerfile and in the script (a cd to an absolute path left it unjudged)
    (context / framework_script).write_text('PKG_DIR="/workspace/docker_image/packages"\ncd /workspace/docker_image\n'
                                            "sh packages/driver.run\n")
    (context / "Dockerfile").write_text(added.replace("&& bash", "&& sh packages/first.run && bash"))
    found = Findings()
    _check_image(Vendor(manifest=load_vendor_manifest(context.parent / MANIFEST), location=str(context.parent)), found)
    assert found.problems == [
        f"{where}: line {number}: names packages/{name}, which is not in {display_path(context)} (FlagPerf's "
        "packages/ goes beside the Dockerfile)" for where, number, name in (
            (display_path(context / "Dockerfile"), 3, "first.run"), (display_path(context / framework_script), 3,
                                                                      "driver.run"))], found.problems


def test_the_packages_check_reads_the_commands_as_the_shell_runs_them(tmp_path: Path) -> None:
    """install -d, a sudo -E or env prefix, cd packages && ./x.sh, # escape=` and a line with a script and a data
    heredoc were misread: what the build made was said missing, or what it ran from packages/ never looked for. Each
    is read as Docker and the shell run it now: only what the build runs and neither has nor makes is a problem."""
    dockerfile = ("# escape=`\nFROM scratch\nCOPY . /w/\nWORKDIR /w\n"
                  "RUN sudo -E install -d packages/dl && env LANG=C cp /tmp/a.run packages/a.run `\n"
                  "  && sh packages/dl/b.run packages/a.run && cd packages && ./setup.sh && sh missing.run\n"
                  "RUN bash -e <<SCRIPT && cat <<CONF > /etc/pip.conf\ncd packages\npip install wheels/*.whl\nSCRIPT\n"
                  "[global]\nfind-links = packages/not-a-path\nCONF\n"
                  "RUN bash /w/install.sh\n")
    script = "#!/bin/sh\nset -e\nVER=1 sudo mkdir -p packages/build\ncd packages/build && ../setup.sh && ./made.sh\n"
    found, context = _image_findings(tmp_path, dockerfile, script, ("packages/setup.sh", "packages/wheels/t.whl"))
    assert found.problems == [
        heredoc_problem(context / "Dockerfile", 7, "<<SCRIPT"),
        f"{display_path(context / 'Dockerfile')}: line 5: names missing.run (packages/missing.run after cd packages), "
        f"which is not in {display_path(context)} (FlagPerf's packages/ goes beside the Dockerfile)"], found.problems
    assert found.notes == [], found.notes
    assert validate_findings(context / "Dockerfile") == found.problems  # validate of the Dockerfile says the same


def test_a_dot_file_link_out_of_the_vendor_folder_is_named(tmp_path: Path) -> None:
    """The link scan passes over dot-files, as a round's does: a dot-folder was named in a note, but a dot-file
    that is a link out of the vendor folder went unsaid, though in a round's container it may lead nowhere. It is
    named in a note now, with where it leads; one that stays in the folder is no news."""
    folder = tmp_path / "vendors" / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", folder)
    (tmp_path / "token.txt").write_text("x\n")
    (folder / "pytorch" / ".token").symlink_to(os.path.join("..", "..", "..", "token.txt"))
    (folder / ".spec").symlink_to("spec.py")  # inside the folder
    (folder / ".docs").symlink_to("pytorch")  # a dot-folder inside it
    dotted = (".token", ".spec", ".docs", ".datadir")
    found = check_vendor_folder(folder, monitor_seconds=1)
    assert [line for line in found.notes if any(name in line for name in dotted)] == [
        f"{display_path(folder)}: pytorch/.token -> ../../../token.txt leads out of the vendor folder, a dot-file "
        "or folder every round's link scan passes over (no round refuses it): in a round's container, where the "
        "folder is at another path, it may lead nowhere"], found.notes
    assert not [line for line in found.problems if ".token" in line], found.problems
    # A dot-folder that is a link out (os.walk lists it among the folders) was said "not scanned" alone; one by an
    # absolute path leads to that path as the container has it.
    (folder / "pytorch" / ".token").unlink()
    (folder / ".datadir").symlink_to(tmp_path)
    found = check_vendor_folder(folder, monitor_seconds=1)
    assert [line for line in found.notes if any(name in line for name in dotted)] == [
        f"{display_path(folder)}: .datadir -> {tmp_path} leads out of the vendor folder, a dot-file or folder every "
        f"round's link scan passes over (no round refuses it): in a round's container it leads to {tmp_path} as the "
        "container has it"], found.notes
    assert not [line for line in found.problems if ".datadir" in line], found.problems


def test_a_name_the_line_tests_for_first_is_a_note_and_words_that_are_no_files_are_no_names(tmp_path: Path) -> None:
    """After cd packages, a sed expression, echo's text, a git branch and a mirror's address were said missing from
    packages/, and so was an installer the line runs only where it is there. None of those is a name now; the
    guarded installer is a note; an installer run unguarded still is a problem."""
    dockerfile = ("FROM scratch\nRUN cd packages && sed -i 's/check_cuda(CUDA_HOME)/pass/' setup.py && echo \"a.run\" "
                  "&& git checkout origin/main && pip install -i mirrors.aliyun.com/pypi/simple torch\n"
                  "RUN cd packages && if [ -f opt.run ]; then sh opt.run; fi && echo a/b > notes.txt && sh must.run\n")
    found, context = _image_findings(tmp_path, dockerfile)
    where, shown = display_path(context / "Dockerfile"), display_path(context)
    assert found.problems == [f"{where}: line 3: names must.run (packages/must.run after cd packages), which is not "
                              f"in {shown} (FlagPerf's packages/ goes beside the Dockerfile)"], found.problems
    assert found.notes == [f"{where}: line 3: names opt.run (packages/opt.run after cd packages), which is not in "
                           f"{shown}: the script tests for it first ([ -f ... ]), so the build goes on without it; "
                           "if it should be installed, FlagPerf's packages/ goes beside the Dockerfile"], found.notes


def test_an_install_script_is_run_only_by_a_run_step_naming_it_whole(tmp_path: Path) -> None:
    """Any mention of the script's name counted as running it: a COPY of it alone, or bash pre_install.sh beside
    install.sh. Only a RUN step naming it as a whole word runs it now; a RUN that runs a name the shell decides
    ($SCRIPT, a loop over *_install.sh) may run it, which is a note."""
    found, context = _image_findings(tmp_path / "copied", "FROM scratch\nCOPY install.sh pre_install.sh /opt/\n"
                                     "RUN bash /opt/pre_install.sh\n", "true\n", ("pre_install.sh",))
    assert [line.split(": ", 1)[1].split(",", 1)[0] for line in found.problems] == [
        "install.sh is beside the Dockerfile"], found.problems
    found, context = _image_findings(tmp_path / "named", "FROM scratch\nARG NAME=install\nCOPY . /w/\n"
                                     "RUN bash /w/${NAME}.sh && for s in x y; do sh $s; done\n", "true\n")
    assert found.problems == [] and [line.split(" (this check")[0] for line in found.notes] == [
        f"{display_path(context / 'Dockerfile')}: line 4 runs /w/*.sh, which may be install.sh"], found


def test_a_missing_health_module_is_named_with_the_other_missing_files(tmp_path: Path) -> None:
    """vendor.yaml's health_module is a file the check looks for, as it does the spec module and the monitors: every
    missing one named at once."""
    vendor = tmp_path / "testvendor"
    shutil.copytree(FIXTURE / "vendors" / "testvendor", vendor)
    (vendor / MANIFEST).write_text((vendor / MANIFEST).read_text() + "health_module: health.py\n")
    (vendor / "spec.py").unlink()
    problems = check_vendor_folder(vendor, monitor_seconds=1).problems
    assert len(problems) == 2 and "spec_module: 'spec.py' does not exist" in problems[0], problems
    assert "health_module: 'health.py' does not exist" in problems[1]

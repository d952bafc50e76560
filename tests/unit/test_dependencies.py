"""Dependencies: pyproject's ranges, the lock (constraints.txt) and the vendor images' requirements.

The image test resolves the NVIDIA image's requirements for NGC's two Pythons with pip's own resolver
against the package index (NGC images cannot be pulled here, so the image itself is not built).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints.txt"
NVIDIA_IMAGE = ROOT / "vendor_images" / "nvidia" / "pytorch"
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def declared() -> list[Requirement]:
    """Every requirement of the project and its extras, but the extras' references to the project itself."""
    meta = project()
    reqs = [Requirement(r) for r in meta["dependencies"]]
    reqs += [Requirement(r) for extra in meta["optional-dependencies"].values() for r in extra]
    return [r for r in reqs if canonicalize_name(r.name) != canonicalize_name(meta["name"])]


def environment(python: str) -> dict[str, str]:
    return {**default_environment(), "python_version": python, "python_full_version": f"{python}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}


def locked(python: str) -> dict[str, Version]:
    """The lock's pins that apply on ``python`` (Linux x86_64)."""
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("  #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(environment(python)):
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_no_exact_pins_in_pyproject() -> None:
    # An exact pin excludes every Python and platform that release has no wheel for (orjson==3.8.3 on 3.12).
    pinned = [str(r) for r in declared() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == []


@pytest.mark.parametrize("python", SUPPORTED)
def test_the_lock_pins_every_declared_package_within_its_range(python: str) -> None:
    pins = locked(python)
    problems = []
    for req in declared():
        if req.marker is not None and not req.marker.evaluate(environment(python)):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req.name}: not in constraints.txt")
        elif not req.specifier.contains(pin, prereleases=True):
            problems.append(f"{req.name}=={pin} is outside {req.specifier}")
    assert problems == [], "constraints.txt is stale; run .ci/lock: " + "; ".join(problems)


def test_the_lock_keeps_what_is_known_broken_out() -> None:
    for python in SUPPORTED:
        pins = locked(python)
        assert pins["sqlalchemy"] < Version("2.1")  # prefect 3.8's scheduler fails on 2.1
        assert pins["prefect"] < Version("3.9")
        assert pins["fastapi"] < Version("0.151")  # prefect 3.8's deploy gets 422s from 0.151 on
        assert pins["torch"] == Version("2.13.0")  # the CPU build this project's machines carry


# Releases found to break the project within the range it allowed then; an install without the lock takes the
# newest in range, so the range itself must leave them out (.ci/newest-in-range checks the newest set for real).
KNOWN_BROKEN = {
    "fastapi": ["0.151.0", "0.154.0", "0.155.0"],  # 422 on prefect 3.8's workers/filter: `prefect deploy` fails
    "sqlalchemy": ["2.1.0"],  # prefect 3.8's scheduler: "Can't evaluate bulk DML statement"
    "prefect": ["3.9.0"],  # needs a newer certifi than some registries carry
    # flagperf/site/served.py runs Prefect's websockets on uvicorn's sans-I/O protocol, which sends no keepalive
    # pings before 0.44.0 (a dead client's socket stays open), nor a clean close frame before 0.39
    "uvicorn": ["0.35.0", "0.38.0", "0.43.0"],
}


@pytest.mark.parametrize("package", sorted(KNOWN_BROKEN))
def test_the_ranges_keep_what_is_known_broken_out(package: str) -> None:
    (req,) = [r for r in declared() if canonicalize_name(r.name) == package]
    allowed = [v for v in KNOWN_BROKEN[package] if req.specifier.contains(v, prereleases=True)]
    assert allowed == [], f"pyproject.toml's {req} allows {allowed}"


def test_ci_runs_the_readme_tests_with_the_lock_and_the_server_path_with_the_newest_in_range() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    # the unit tests beside the integration tests, in the groups of tests/lanes.py
    test_command = ('pip install -c constraints.txt -e ".[test]" && ruff check . && '
                    'python -m pytest -n 2 --dist loadgroup')
    assert test_command in readme and test_command in ci
    assert re.search(r"^bash \.ci/newest-in-range\b", ci, re.M)
    newest = (ROOT / ".ci" / "newest-in-range").read_text()
    # The newest set: nothing from the lock but torch's pin (see the script), and no constraints of the caller's.
    assert "-c constraints.txt" not in newest and "-r constraints.txt" not in newest
    assert re.search(r"grep -E '\^torch==' constraints\.txt", newest)
    assert "-u PIP_CONSTRAINT" in newest
    assert re.search(r'^if ! "\$venv/bin/python" \.ci/server_smoke\.py; then$', newest, re.M)
    # The generate extra too, so the newest transformers in range is installed and run (`transformers serve`).
    assert '-e ".[generate]"' in newest
    assert re.search(r'^if ! "\$venv/bin/python" \.ci/generate_smoke\.py; then$', newest, re.M)


def test_ci_and_readme_install_with_the_lock() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"pip install -c constraints\.txt -e \"\.\[test\]\"", ci)
    assert "pip install -c constraints.txt -e ." in readme


def test_nvidia_image_defaults_to_a_current_ngc_base_and_installs_only_its_requirements() -> None:
    dockerfile = (NVIDIA_IMAGE / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    assert base and re.fullmatch(r"nvcr\.io/nvidia/pytorch:2[5-9]\.\d\d-py3", base.group(1)), base
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", dockerfile, re.M)
    installs = re.findall(r"pip install (.+)$", dockerfile, re.M)
    assert installs == ["-r /opt/flagperf/requirements.txt"]
    assert not re.search(r"^ENV ", dockerfile, re.M)  # one layer per instruction: see the cpu Dockerfile


def image_requirements() -> list[Requirement]:
    lines = (NVIDIA_IMAGE / "requirements.txt").read_text().splitlines()
    return [Requirement(line.split("#", 1)[0]) for line in lines if line.split("#", 1)[0].strip()]


def test_image_requirements_are_the_projects_own_ranges() -> None:
    # The image must not drift from pyproject: same packages, same ranges, and never torch (the image's own).
    ranges = {canonicalize_name(r.name): r.specifier for r in declared()}
    for req in image_requirements():
        name = canonicalize_name(req.name)
        assert name != "torch"
        assert name in ranges, f"{req.name} is not a dependency in pyproject.toml"
        assert req.specifier == ranges[name], f"{req.name}: {req.specifier} here, {ranges[name]} in pyproject.toml"


@pytest.mark.parametrize("python", ["3.10", "3.12"])  # NGC 24.xx and 25.xx
def test_nvidia_image_requirements_resolve(python: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--python-version", python, "--only-binary=:all:", "--target", str(tmp_path / "target"),
         "--report", str(report), "-r", str(NVIDIA_IMAGE / "requirements.txt")],
        capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    chosen = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
              for i in json.loads(report.read_text())["install"]}
    for req in image_requirements():
        assert req.specifier.contains(chosen[canonicalize_name(req.name)], prereleases=True), req
    assert "torch" not in chosen  # nothing in the image's requirements pulls a second torch over NGC's


def test_cpu_image_pins_are_the_locks() -> None:
    # The cpu image (Python 3.11, the test bed's base) installs the lock's versions, so its numbers compare
    # with a plain-process run's.
    folder = ROOT / "vendor_images" / "cpu" / "pytorch"
    base = re.search(r"^ARG BASE_IMAGE=python:(\d+\.\d+)-", (folder / "Dockerfile").read_text(), re.M)
    assert base, "the cpu image's default base names its Python"
    pins = locked(base.group(1))
    for line in (folder / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert Version(spec.version) == pins[canonicalize_name(req.name)], line

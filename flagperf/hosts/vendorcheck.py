"""`flagperf vendor check FOLDER`: what FlagPerf's vendor guide asks of a first-time vendor, checked on one
folder, one line per finding.

  manifest       vendor.yaml loads (the same model `flagperf run` uses)
  image          the Dockerfile, an install step (a RUN line or FlagPerf's <framework>_install.sh) and every file
                 the Dockerfile copies are there
  monitors       each is run for a few seconds here: a header, samples with a timestamp, utilisation and memory
                 (power and temperature recommended), a footer; a monitor whose tool is missing says why and is
                 reported as not checkable here
  peaks          the spec table: built here when the device is present (every figure with a source), else not
                 checkable here; datasheets.yaml entries (the convention of the shipped vendors) each with a source
  adaptations    every case's vendor/<vendor>/ folder read with the forbidden-change checks
                 (flagperf.config.adaptation)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagperf.config.adaptation import read_adaptation
from flagperf.config.cases import available_cases, load_case
from flagperf.config.files import is_present, read_config_text, regular_file
from flagperf.config.vendors import MANIFEST, Vendor, load_vendor_manifest
from flagperf.config.yamlio import parse_yaml_text
from flagperf.errors import ConfigError, FlagperfError
from flagperf.paths import display_path

MONITOR_SECONDS = 3.0
REQUIRED_FIELDS = ("util_percent", "mem_used_bytes")
RECOMMENDED_FIELDS = ("power_w", "temp_c")


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    not_checkable: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def problem(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")


def check_vendor_folder(folder: Path, monitor_seconds: float = MONITOR_SECONDS) -> Findings:
    """Raises ConfigError when the folder is not a vendor folder at all (the user's error)."""
    if not (folder / MANIFEST).exists():
        raise ConfigError(str(folder), None, f"not a vendor folder (no {MANIFEST})")
    found = Findings()
    try:
        manifest = load_vendor_manifest(folder / MANIFEST)
    except FlagperfError as exc:
        found.problems.append(str(exc))
        return found
    found.passed.append(f"manifest {display_path(folder / MANIFEST)}")
    vendor = Vendor(manifest=manifest, location=str(folder.resolve()))
    _check_image(vendor, found)
    for entry in manifest.monitors:
        _check_monitor(vendor, entry.name, vendor.monitor_command(entry, sys.executable), monitor_seconds, found)
    _check_peaks(vendor, found)
    _check_adaptations(vendor, found)
    return found


def _check_image(vendor: Vendor, found: Findings) -> None:
    dockerfile = vendor.folder / vendor.manifest.container.dockerfile
    where = display_path(dockerfile)
    try:  # a regular file when the manifest was read; bounded and never blocking if it changed since
        text = read_config_text(dockerfile, what="a Dockerfile")
    except ConfigError as exc:
        found.problem(where, exc.message)
        return
    context = dockerfile.parent
    scripts = sorted(p.name for p in context.glob("*install*.sh"))
    if not re.search(r"^\s*RUN\s", text, re.M) and not scripts:
        found.problem(where, "no install step (a RUN line, or FlagPerf's <framework>_install.sh beside it)")
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if parts[:1] in (["COPY"], ["ADD"]) and not any(p.startswith("--from") for p in parts):
            for name in (p for p in parts[1:-1] if not p.startswith("--")):
                if not (context / name).exists():
                    found.problem(where, f"line {number}: copies {name}, which is not in {display_path(context)}")
    for script in scripts:
        if script not in text:
            found.problem(where, f"{script} is beside the Dockerfile but the Dockerfile never uses it")
    if not any(where in p for p in found.problems):
        found.passed.append(f"image {where}" + (f" with {', '.join(scripts)}" if scripts else ""))


def _check_monitor(vendor: Vendor, name: str, command: list[str], seconds: float, found: Findings) -> None:
    where = f"monitor {name}"
    with tempfile.TemporaryDirectory(prefix="flagperf-vendor-check-") as scratch:
        out = Path(scratch) / f"monitor_{name}.jsonl"
        argv = [*command, "--out", str(out), "--interval", "1", "--max-seconds", str(seconds)]
        try:
            completed = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False,
                                       cwd=vendor.folder)
        except subprocess.TimeoutExpired:
            found.problem(where, f"did not stop within {seconds + 60:.0f} s of --max-seconds {seconds:g}")
            return
        if completed.returncode != 0:
            last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
            found.problem(where, f"exited {completed.returncode}: {last}")
            return
        try:
            records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            found.problem(where, f"its output is not JSON lines: {exc}")
            return
    if not records or records[0].get("type") != "header":
        found.problem(where, "the first line is not a header")
        return
    sources = records[0].get("sources") or {}
    unavailable = [f"{k}: {v.get('reason')}" for k, v in sources.items() if isinstance(v, dict)
                   and v.get("available") is False]
    samples = [r for r in records if r.get("type") == "sample"]
    if not samples and unavailable:
        found.not_checkable.append(f"{where}: {'; '.join(unavailable)}")
        return
    if records[-1].get("type") != "footer":
        found.problem(where, "no footer line after --max-seconds (it must stop cleanly)")
    if not samples:
        found.problem(where, "wrote no samples")
        return
    if any(not isinstance(s.get("t"), int | float) for s in samples):
        found.problem(where, "a sample without its timestamp t")
    devices = [d for s in samples for d in (s.get("devices") or []) if isinstance(d, dict)]
    if devices:
        for key in REQUIRED_FIELDS:
            if all(d.get(key) is None for d in devices):
                found.problem(where, f"no device sample has {key} (required: timestamp, utilisation, memory)")
        missing = [k for k in RECOMMENDED_FIELDS if all(d.get(k) is None for d in devices)]
        if missing:
            found.not_checkable.append(f"{where}: recommended {', '.join(missing)} not reported here")
    if not any(p.startswith(where) for p in found.problems):
        found.passed.append(f"{where}: {len(samples)} samples in {seconds:g} s"
                            + (f" ({'; '.join(unavailable)})" if unavailable else ""))


def _check_peaks(vendor: Vendor, found: Findings) -> None:
    sheets = vendor.folder / "datasheets.yaml"
    entries: Any = []
    if is_present(sheets):  # read as every config file is: inside the folder, regular, bounded, nesting bounded
        try:
            path = regular_file(vendor.folder, sheets.name, display_path(vendor.folder), None, "the vendor folder")
            entries = parse_yaml_text(read_config_text(path), display_path(sheets)) or []
        except ConfigError as exc:
            found.problems.append(str(exc))
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict) or not str(entry.get("source") or "").strip():
                found.problem(display_path(sheets), f"entry {i}: no source (where each figure comes from)")
    try:
        table = vendor.spec_table()
    except Exception as exc:  # the vendor's code on a machine without its device: say so, do not fail
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        found.not_checkable.append(f"peaks: {vendor.manifest.spec_module} cannot build a table here: {detail}")
        return
    for key, peak in table.peaks.items():
        if peak.value is not None and not (peak.source or "").strip():
            found.problem(f"peaks.{key}", f"{peak.value} {peak.unit} without a source")
    found.passed.append(f"peaks: {len(table.peaks)} figures for {table.device}")


def _check_adaptations(vendor: Vendor, found: Findings) -> None:
    try:
        cases = available_cases()
    except FlagperfError as exc:
        found.problems.append(str(exc))
        return
    for name in sorted(cases):
        try:
            case = load_case(name, cases)
            adaptation = read_adaptation(case.folder, name, case.family, vendor.name)
        except FlagperfError as exc:
            found.problems.append(str(exc))
            continue
        if adaptation is not None and not adaptation.empty:
            points = [p for p, used in (("environment file", adaptation.env), ("requirements", adaptation.requirements),
                                        ("csrc", adaptation.csrc), ("extern " + ",".join(adaptation.hooks),
                                                                    adaptation.extern)) if used]
            found.passed.append(f"adaptation of {name}: {'; '.join(points)}")


def summary_lines(found: Findings) -> list[tuple[str, str]]:
    return ([("ok", line) for line in found.passed] + [("not checkable here", line) for line in found.not_checkable]
            + [("problem", line) for line in found.problems])


def as_json(found: Findings) -> dict[str, Any]:
    return {"problems": found.problems, "not_checkable": found.not_checkable, "ok": found.passed}

"""FlagPerf's training configuration, loaded with FlagPerf's meaning: run_benchmarks/config/test_conf.py and
cluster_conf.py, read without running them (flagperf.config.pyliterals), mapped to an Inventory and the plan's
inputs as FlagPerf's host.yaml is (flagperf.hosts.inventory).

  cluster_conf.py   HOSTS (HOSTS[0] is the master), SSH_PORT, MASTER_PORT; HOSTS_PORTS is not used
  test_conf.py      VENDOR, ACCE_CONTAINER_OPT (parsed and checked, never passed to a shell),
                    ACCE_VISIBLE_DEVICE_ENV_NAME, SHM_SIZE, FLAGPERF_PATH (the project's folder on the hosts),
                    FLAGPERF_LOG_PATH (the results folder), CASES
  CASES             {"model:framework:hardware:nnodes:nproc:repeat": "data dir"}: model -> a training case
                    (TRAINING_MODELS, or this project's case name), nnodes/nproc -> the case's nnodes and
                    nproc_per_node (so its scale file vendor/<vendor>/config_<hw>x<nnodes>x<nproc>.yaml or
                    .py is read), repeat -> rounds, data dir -> mounted into the containers and given to the
                    case's data key where the case reads FlagPerf's data layout
What this engine does differently is said where it applies, as a note of the run (never silently).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flagperf.config.adaptation import adaptation_folder
from flagperf.config.cases import available_cases, load_case
from flagperf.config.files import given_name, is_present
from flagperf.config.models import check_name
from flagperf.config.pyliterals import LiteralFile, read_literal_file
from flagperf.config.vendors import load_vendor
from flagperf.errors import ConfigError
from flagperf.hosts.container_policy import PolicyError, allowed_roots, parse_data_mount
from flagperf.hosts.inventory import (
    DEFAULT_MASTER_PORT,
    ENV_NAME,
    HOST_YAML_NOT_USED,
    Inventory,
    build_inventory,
    check_vendor,
    load_inventory,
    local_inventory,
    parse_container_options,
    project_root_problem,
    split_address,
    visible_env_note,
)
from flagperf.paths import display_path
from flagperf.results.schema import MAX_NNODES, MAX_ROUNDS  # the plan's limits for rounds and nnodes

CLUSTER_CONF = "cluster_conf.py"  # FlagPerf keeps it beside test_conf.py, in run_benchmarks/config/
CLUSTER_CONF_KEYS = {"HOSTS", "SSH_PORT", "HOSTS_PORTS", "MASTER_PORT"}
TEST_CONF_KEYS = {"VENDOR", "ACCE_CONTAINER_OPT", "ACCE_VISIBLE_DEVICE_ENV_NAME", "PIP_SOURCE", "FLAGPERF_PATH",
                  "FLAGPERF_LOG_PATH", "FLAGPERF_LOG_LEVEL", "SHM_SIZE", "CLEAR_CACHES", "CASES"}
CASE_FIELDS = ("model", "framework", "hardware", "nnodes", "nproc", "repeat")


@dataclass(frozen=True)
class TrainingModel:
    """How one of FlagPerf's training models is run here."""

    case: str  # the training case under cases/training/
    settings: dict[str, Any] = field(default_factory=dict)  # case settings that make it FlagPerf's model
    data_key: str | None = None  # the case key FlagPerf's data dir goes to; None: the case reads another form
    data_note: str = ""  # why the data dir is not given to the case (data_key None)


# FlagPerf's model names (the first field of a CASES key) with a counterpart here. A name that is this
# project's own training case (digits-mlp, llama-pretrain ...) is accepted as well, its data dir given to its
# data_dir key where it has one.
TRAINING_MODELS: dict[str, TrainingModel] = {
    "resnet50": TrainingModel("resnet50", data_key="data_dir"),  # ImageNet folder: train/<class>, val/<class>
    "bert": TrainingModel("bert", data_note="bert reads a token file (data_path: .npy token ids), not FlagPerf's "
                                            "hdf5 shards; without data_path it trains on synthetic tokens, marked so"),
    "llama3_8B": TrainingModel("llama-pretrain", settings={"model": "llama-3-8b"},
                               data_note="llama-pretrain reads a token file (data_path: .npy token ids), not "
                                         "Megatron's indexed dataset; without data_path it trains on synthetic "
                                         "tokens, marked so"),
}


def open_inventory(inventory: str | Path | None, cluster_conf: str | Path | None = None) -> Inventory:
    """The hosts a run uses: FlagPerf training's test_conf.py (with its cluster_conf.py), a native inventory
    or FlagPerf's host.yaml, or this machine when none is given."""
    if inventory is None:
        if cluster_conf is not None:
            raise ConfigError(display_path(Path(cluster_conf)), None, "a cluster_conf.py goes with a test_conf.py")
        return local_inventory()
    path = Path(inventory)
    if path.suffix == ".py" or cluster_conf is not None:
        return load_training_conf(path, Path(cluster_conf) if cluster_conf is not None else None)
    return load_inventory(path)


def default_cluster_conf(test_conf: Path) -> Path:
    return test_conf.parent / CLUSTER_CONF


def load_training_conf(test_conf: Path, cluster_conf: Path | None = None) -> Inventory:
    """test_conf.py and cluster_conf.py (by default the one beside it, as FlagPerf has them) as an Inventory
    whose cases, case overrides, rounds and results folder are FlagPerf's."""
    cluster_conf = cluster_conf or default_cluster_conf(test_conf)
    if not is_present(cluster_conf):
        raise ConfigError(display_path(cluster_conf), None, f"file not found (the cluster_conf.py of "
                                                            f"{display_path(test_conf)}; give --cluster-conf)")
    test = read_literal_file(test_conf)
    cluster = read_literal_file(cluster_conf)
    for read, keys, other in ((test, TEST_CONF_KEYS, CLUSTER_CONF_KEYS), (cluster, CLUSTER_CONF_KEYS, TEST_CONF_KEYS)):
        for name in read.values:
            if name not in keys:
                where = "it belongs in the other file" if name in other else "unknown name"
                raise ConfigError(read.where(name), name, f"{where} (read here: {', '.join(sorted(keys))})")

    hosts = _hosts(cluster)
    vendor = test.values.get("VENDOR")
    if not isinstance(vendor, str):
        raise ConfigError(test.where("VENDOR"), "VENDOR", "required: the vendor folder under vendor_images/")
    check_vendor(vendor, test.where("VENDOR"), "VENDOR")
    docker: dict[str, Any] = {}
    options = test.values.get("ACCE_CONTAINER_OPT")
    if options:
        if not isinstance(options, str):
            raise ConfigError(test.where("ACCE_CONTAINER_OPT"), "ACCE_CONTAINER_OPT", "must be a string of options")
        try:
            parse_container_options(options)
        except ValueError as exc:
            raise ConfigError(test.where("ACCE_CONTAINER_OPT"), "ACCE_CONTAINER_OPT", str(exc)) from None
        docker["extra_options"] = options
    defaults: dict[str, Any] = {"port": _port(cluster, "SSH_PORT", 22), "runtime": "docker", "docker": docker}
    visible_env = test.values.get("ACCE_VISIBLE_DEVICE_ENV_NAME")
    if visible_env is not None:
        if not isinstance(visible_env, str) or not ENV_NAME.match(visible_env):
            raise ConfigError(test.where("ACCE_VISIBLE_DEVICE_ENV_NAME"), "ACCE_VISIBLE_DEVICE_ENV_NAME",
                              f"{visible_env!r} is not a variable name")
        defaults["visible_devices_env"] = visible_env
    visible_note = visible_env_note(vendor, visible_env, test.where("ACCE_VISIBLE_DEVICE_ENV_NAME")) \
        if isinstance(visible_env, str) else None
    for key, target in (("SHM_SIZE", "shm_size"), ("FLAGPERF_PATH", "project_root")):
        value = test.values.get(key)
        if value is not None and value != "":
            if not isinstance(value, str):
                raise ConfigError(test.where(key), key, f"must be a string, got {value!r}")
            if key == "FLAGPERF_PATH":
                _check_path(value, test.where(key), key, absolute=True)
            defaults[target] = value.lower() if key == "SHM_SIZE" else value
    log_path = test.values.get("FLAGPERF_LOG_PATH")
    if log_path is not None and (not isinstance(log_path, str) or not log_path):
        raise ConfigError(test.where("FLAGPERF_LOG_PATH"), "FLAGPERF_LOG_PATH", "must be a folder")
    if log_path:
        _check_path(log_path, test.where("FLAGPERF_LOG_PATH"), "FLAGPERF_LOG_PATH", absolute=False)

    cases = _cases(test, vendor, len(hosts))
    for entry in cases:
        if entry.data_dir is not None:
            docker.setdefault("data_mounts", [])
            if entry.data_dir not in docker["data_mounts"]:
                docker["data_mounts"].append(entry.data_dir)
    source = display_path(test_conf)
    specs = []
    for i, address in enumerate(hosts):
        host, host_port = split_address(address)  # checked in _hosts
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", address).strip("_.-") or f"host{i}"  # FlagPerf: the address
        specs.append({"name": name, "address": host, **({"port": host_port} if host_port is not None else {})})
    try:
        inventory = build_inventory({"vendor": vendor, "master_port": _port(cluster, "MASTER_PORT",
                                                                            DEFAULT_MASTER_PORT),
                                     "defaults": defaults, "hosts": specs}, source, test_conf.parent)
    except ConfigError as exc:  # a host's key made from one of FlagPerf's: name the file it came from
        raise ConfigError(f"{source} + {display_path(cluster_conf)}", exc.key, exc.message) from None

    rounds = {entry.repeat for entry in cases}
    if len(rounds) > 1:
        listed = ", ".join(f"{entry.key} repeats {entry.repeat}" for entry in cases)
        raise ConfigError(test.where("CASES"), "CASES", f"every case runs the same number of rounds here ({listed}): "
                                                        "give the cases with another repeat in another test_conf.py")
    overrides: dict[str, Any] = {}
    notes: list[str] = [visible_note] if visible_note else []
    for entry in cases:
        overrides.update({f"{entry.case}.{key}": value for key, value in entry.overrides.items()})
        notes += entry.notes
    single = [entry.case for entry in cases if entry.nnodes == 1]
    if single and len(hosts) > 1:
        notes.append(f"{cluster.where('HOSTS')}: HOSTS: a single-node case ({', '.join(single)}) runs on every host "
                     "here, one result per host (FlagPerf runs it on HOSTS[0] only)")
    notes += [f"{read.where(key)}: {key} is not used: {why}" for read in (test, cluster)
              for key, why in HOST_YAML_NOT_USED.items() if key in read.values]
    return replace(inventory, source=source, cases=[entry.case for entry in cases], notes=notes,
                   results_dir=log_path, case_overrides=overrides, rounds=cases[0].repeat)


@dataclass
class _CaseEntry:
    key: str
    case: str
    nnodes: int
    repeat: int
    data_dir: str | None
    overrides: dict[str, Any]
    notes: list[str]


def _hosts(cluster: LiteralFile) -> list[str]:
    hosts = cluster.values.get("HOSTS")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ConfigError(cluster.where("HOSTS"), "HOSTS", "required: a non-empty list of addresses")
    for i, address in enumerate(hosts):
        try:
            split_address(address)
        except ValueError as exc:
            raise ConfigError(cluster.where("HOSTS"), f"HOSTS.{i}", str(exc)) from None
    return hosts


def _check_path(value: str, where: str, key: str, absolute: bool) -> None:
    """A folder's path as a path: no control characters (a NUL, a newline), and FLAGPERF_PATH, the project's
    folder on every host, by the inventory's rule for project_root (flagperf.hosts.inventory)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(where, key, f"{value!r} holds a control character")
    problem = project_root_problem(value) if absolute else None
    if problem:
        raise ConfigError(where, key, problem)


def _port(read: LiteralFile, key: str, default: int) -> int:
    value = read.values.get(key, default)
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(read.where(key), key, f"must be a port number, got {value!r}")
    return int(text)


def _whole(value: str, name: str, where: str, key: str, top: int) -> int:
    if not value.isdigit() or not 1 <= int(value) <= top:
        raise ConfigError(where, f"CASES.{key}", f"{name} must be a whole number from 1 to {top}, got {value!r}")
    return int(value)


def _cases(test: LiteralFile, vendor: str, host_count: int) -> list[_CaseEntry]:
    where = test.where("CASES")
    raw = test.values.get("CASES")
    if isinstance(raw, list):
        raise ConfigError(where, "CASES", "a list of case names is FlagPerf's first format; write CASES = "
                                          "{\"model:framework:hardware:nnodes:nproc:repeat\": \"data dir\"}")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(where, "CASES", "required: {\"model:framework:hardware:nnodes:nproc:repeat\": \"data dir\"}")
    known = available_cases()
    training = sorted(name for name, folder in known.items() if folder.parent.name == "training")
    hardware = load_vendor(vendor).manifest.hardware or vendor
    entries: list[_CaseEntry] = []
    for key, data_dir in raw.items():
        fields = str(key).split(":")
        if len(fields) != len(CASE_FIELDS):
            raise ConfigError(where, f"CASES.{key}", f"expected {':'.join(CASE_FIELDS)} ({len(fields)} fields given)")
        model, framework, case_hardware, nnodes_text, nproc_text, repeat_text = fields
        nnodes = _whole(nnodes_text, "nnodes", where, key, MAX_NNODES)
        if nnodes > host_count:
            raise ConfigError(where, f"CASES.{key}", f"nnodes {nnodes} is more than the {host_count} HOSTS of the "
                                                     "cluster_conf.py")
        nproc = _whole(nproc_text, "nproc", where, key, 1024)
        repeat = _whole(repeat_text, "repeat", where, key, MAX_ROUNDS)
        if not isinstance(data_dir, str) or not data_dir.startswith("/"):
            raise ConfigError(where, f"CASES.{key}", f"the data dir must be an absolute path, got {data_dir!r}")
        try:  # mounted into the case's containers: a data folder by the container policy, as host.yaml's
            parse_data_mount(data_dir, allowed_roots())
        except PolicyError as exc:
            raise ConfigError(where, f"CASES.{key}", str(exc)) from None
        mapped = TRAINING_MODELS.get(model)
        if mapped is None and model in training:
            own_keys = load_case(model, known).manifest.configurations
            # A case that reads a file (data_path) says so: "reads no data dir" would read as "needs no data".
            mapped = TrainingModel(model, data_key="data_dir" if "data_dir" in own_keys else None,
                                   data_note=f"{model} reads a file (data_path), not a data dir; without it, "
                                             "synthetic data, marked so" if "data_path" in own_keys
                                   else f"{model} reads no data dir")
        if mapped is None:
            raise ConfigError(where, f"CASES.{key}", f"no training case for model {model!r} (FlagPerf models mapped "
                                                     f"here: {', '.join(sorted(TRAINING_MODELS))}; training cases: "
                                                     f"{', '.join(training)})")
        for text, what in ((framework, "framework"), (case_hardware, "hardware")):
            try:
                check_name(text, what)
            except ValueError as exc:
                raise ConfigError(where, f"CASES.{key}", str(exc)) from None
        if any(entry.case == mapped.case for entry in entries):
            raise ConfigError(where, f"CASES.{key}", f"{mapped.case} is listed twice: a case runs at one scale per "
                                                     "run here; give the other scale in another test_conf.py")
        case = load_case(mapped.case, known)
        notes: list[str] = []
        if case_hardware != hardware:
            folder = adaptation_folder(case.folder, vendor)  # the case's vendor/<vendor>/ or the vendor's own folder
            for suffix in (".yaml", ".py"):
                named = folder / f"config_{case_hardware}x{nnodes}x{nproc}{suffix}"
                if is_present(named):
                    raise ConfigError(where, f"CASES.{key}", f"{display_path(named)} would not be read: vendor "
                                      f"{vendor}'s scale files are config_{hardware}x<nnodes>x<nproc> (its vendor.yaml "
                                      "hardware)")
            notes.append(f"{where}: CASES.{key}: hardware {case_hardware}: the scale file read is {given_name(folder)}/"
                         f"config_{hardware}x{nnodes}x{nproc} (vendor {vendor}'s hardware name), where present")
        if framework.split("_")[0] != "pytorch":
            notes.append(f"{where}: CASES.{key}: framework {framework} is not used: {mapped.case} is this project's "
                         f"PyTorch case, run in vendor {vendor}'s image")
        overrides: dict[str, Any] = {**mapped.settings, "nnodes": nnodes, "nproc_per_node": nproc}
        if mapped.data_key is not None:
            overrides[mapped.data_key] = data_dir
        else:
            notes.append(f"{where}: CASES.{key}: {data_dir} is mounted, not read: {mapped.data_note}")
        entries.append(_CaseEntry(str(key), mapped.case, nnodes, repeat, data_dir, overrides, notes))
    return entries

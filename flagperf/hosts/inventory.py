"""Inventories: which hosts an evaluation runs on and how each is reached.

Two formats, one model:
  * the native inventory (YAML, see deployments/inventories/example.yaml): ``defaults`` + ``hosts``;
  * FlagPerf's own host.yaml (HOSTS, SSH_PORT, VENDOR, CASES, SHM_SIZE, ACCE_CONTAINER_OPT,
    ACCE_VISIBLE_DEVICE_ENV_NAME, MASTER_PORT ...), read with FlagPerf's meaning by ``load_host_yaml``.
No secrets live here: keys are file paths (or the SSH agent), passwords are not accepted. Environment
values and build args may be ``${NAME}`` references to the controller's (or a host worker's) environment;
every value given literally is masked wherever a spec is written down (plan.json, Prefect parameters, job
files), and subflows in this process get the real spec back from ``host_spec``.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_serializer, field_validator, model_validator

from flagperf.config.cases import available_cases, load_case
from flagperf.config.endpoints import Endpoint
from flagperf.config.files import is_present, read_config_text, regular_file_problem
from flagperf.config.models import (
    StrictModel,
    SuiteFile,
    check_name,
    looks_like_suite,
    pydantic_error_to_config_error,
)
from flagperf.config.vendors import (
    HostSpecSettings,
    Vendor,
    available_vendors,
    check_host_spec_settings,
    load_vendor,
    spec_settings_problem,
)
from flagperf.config.yamlio import load_yaml_mapping
from flagperf.errors import ConfigError, FlagperfError, gathered, unknown_name
from flagperf.hosts.container_policy import (
    ENV_NAME,
    Mount,
    PolicyError,
    allowed_roots,
    check_data_roots,
    check_device,
    clean_path,
    mount_target_problem,
    parse_container_options,
    parse_data_mount,
    work_root_source_problem,
)
from flagperf.hosts.slurm_spec import PATH_REFUSED, SlurmSpec, slurm_entry_problem, slurm_slots
from flagperf.paths import PROJECT_ROOT, VENDOR_MANIFEST, display_path

REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")  # ${NAME}: a value taken from the environment
MASK = "<masked>"  # what a literal value looks like wherever a spec is written down
# Host names reach ssh/paramiko and docker labels: labels of letters, digits, '-' and '_' (an ~/.ssh/config
# alias may have one), never a leading '-' (an option).
HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
MAX_HOST_NAME = 253
ADDRESS_CHARACTERS = re.compile(r"[A-Za-z0-9_.:\[\]%-]+")  # no spaces or quotes, whatever else is wrong
IPV4_LIKE = re.compile(r"[0-9.]+")  # digits and dots only: an IPv4 address or nothing
VISIBLE_DEVICE = re.compile(r"-?[A-Za-z0-9_][A-Za-z0-9_./:-]{0,127}")  # 0, -1, GPU-<uuid>, MIG-GPU-<uuid>/1/0
DEFAULT_MASTER_PORT = 29501
MAX_EXPECTED_DEVICES = 1024  # a host's devices, as FlagPerf's NPROC_PER_NODE allows them
LOCAL_ADDRESSES = ("local", "localhost", "127.0.0.1")


def project_root_problem(value: str | PurePath) -> str | None:
    """Why ``value`` may not be a host's project_root (FlagPerf's FLAGPERF_PATH), or None. One rule wherever it is
    written (an inventory, host.yaml, test_conf.py), for every transport: it is the hosts' working folder (cd), a
    container mount (Docker's, and an item of Slurm's --container-mounts SRC:DST[:ro],... list), PYTHONPATH
    (':'-separated) and a word of job scripts, so no '..', no list separators, no %-patterns, no control characters."""
    text = str(value)
    path = PurePath(text)
    if not path.is_absolute() or ".." in path.parts or path == PurePath("/") or PATH_REFUSED.search(text):
        return (f"{text!r} must be an absolute path without '..', ',', ':', '%' or control characters, and not '/' "
                "(the project's folder on the hosts: their working folder, a container mount and PYTHONPATH)")
    return None


class DockerSpec(StrictModel):
    """How a host's container engine is reached and what images are built from."""

    engine: Literal["local", "ssh"] | None = Field(
        default=None, description="local: the controller's engine socket (DOCKER_HOST or the default); ssh: the "
                                  "host's own engine through the host's SSH connection. Default: ssh for SSH "
                                  "hosts, local for the local host")
    base_url: str | None = Field(default=None, description="engine URL for engine: local (unix:///..., tcp://...)")
    build_args: dict[str, str] = Field(default_factory=dict, description="e.g. BASE_IMAGE for a local base image")
    # Declared before the mounts: their checks read it (container_policy.py has the rules).
    data_roots: list[str] = Field(default_factory=list, description="folders besides the built-in data roots "
                                  "(/data, /datasets, /mnt, /raid, ...) that mounts may come from")
    data_mounts: list[str] = Field(default_factory=list, description="host folders under a data root mounted at the "
                                   "same path, read-only; PATH:rw for a folder the case writes to")
    extra_options: str | None = Field(default=None, description="FlagPerf's ACCE_CONTAINER_OPT, e.g. ' --gpus all'")

    @field_validator("build_args")
    @classmethod
    def _arg_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"build arg name {name!r} is not a valid name")
        return value

    @field_validator("data_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        check_data_roots(value)
        return value

    @field_validator("extra_options")
    @classmethod
    def _options(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:  # refused options are refused where they are written (devices: for any vendor)
            parse_container_options(value, roots=_roots_of(info), device_patterns=any_vendors_device_patterns())
        return value

    @field_serializer("build_args", when_used="json")
    def _mask_args(self, value: dict[str, str]) -> dict[str, str]:
        return mask_values(value)

    @field_serializer("extra_options", when_used="json")
    def _mask_options(self, value: str | None) -> str | None:
        return mask_container_options(value) if value else value

    def runtime_build_args(self, host: str) -> dict[str, str]:
        return resolve_values(self.build_args, host, "docker.build_args")

    @field_validator("data_mounts")
    @classmethod
    def _mounts(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for entry in value:
            parse_data_mount(entry, _roots_of(info))
        return value

    def allowed_roots(self) -> tuple[str, ...]:
        return allowed_roots(self.data_roots)


def any_vendors_device_patterns() -> list[str]:
    """The device patterns some vendor folder declares: an inventory read before its vendor is known may name
    only devices that one of them allows (the run checks them again against its own vendor's)."""
    patterns: list[str] = []
    for name in available_vendors():
        try:
            patterns += load_vendor(name).manifest.container.device_patterns
        except ConfigError:
            continue  # a broken vendor folder is reported when it is used, not against this inventory
    return sorted(set(patterns))


def _roots_of(info: ValidationInfo) -> tuple[str, ...]:
    """The data roots a DockerSpec being validated allows (none of its own when its data_roots was refused)."""
    return allowed_roots(info.data.get("data_roots") or ())


class AgentSpec(StrictModel):
    """The host runs a Prefect worker: its rounds are dispatched to the host-round deployment on this queue."""

    queue: str | None = Field(default=None, description="work queue of the host's worker; host-<name> by default")
    deployment: str = "host-round/host-round"
    timeout_s: float = Field(default=86400.0, gt=0, description="how long a dispatched round may take, queueing "
                                                                 "included")
    start_timeout_s: float = Field(default=300.0, gt=0, description="how long a dispatched run may wait for the "
                                   "host's worker to pick it up; then the host fails (its worker is down)")


class HostSpec(StrictModel):
    name: str
    address: str = "localhost"
    transport: Literal["local", "ssh", "slurm"] | None = Field(
        default=None, description="local: the controller itself; ssh: through paramiko (default unless the "
                                  "address is local/localhost/127.0.0.1); slurm: jobs on a Slurm cluster (set by "
                                  "a slurm: section)")
    port: int | None = Field(default=None, ge=1, le=65535, description="22 unless ~/.ssh/config says otherwise")
    user: str | None = Field(default=None, description="yours unless ~/.ssh/config says otherwise")
    key_file: Path | None = Field(default=None, strict=False, description="private key file; none: the SSH agent and "
                                                            "~/.ssh/id_* keys")
    known_hosts: Path = Field(default=Path("~/.ssh/known_hosts"), strict=False)
    ssh_config: Path | None = Field(default=Path("~/.ssh/config"), strict=False,
                                    description="OpenSSH client config read for User, Port, IdentityFile and "
                                                "HostName where this file leaves them out")
    accept_new_host_key: bool = Field(default=False, description="trust and record a host key seen for the first "
                                                                 "time (a changed key is always refused)")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    command_timeout_s: float = Field(default=120.0, gt=0, description="limit for the engine's own small commands")
    project_root: Path | None = Field(default=None, strict=False,
                                      description="where the project is deployed on the host (FlagPerf's "
                                                  "FLAGPERF_PATH): absolute, without '..', ',', ':', '%'; the "
                                                  "controller's by default")
    python: str | None = Field(default=None, description="the host's Python with the project's dependencies")
    work_root: Path | None = Field(default=None, strict=False, description="scratch space on the host")
    runtime: Literal["process", "docker"] = "process"
    docker: DockerSpec = Field(default_factory=DockerSpec)
    shm_size: str | None = Field(default=None, description="container shared memory; the vendor's by default")
    visible_devices: str | None = Field(default=None, description="value for the visible-devices variable")
    visible_devices_env: str | None = Field(default=None, description="that variable's name; the vendor's by "
                                                                      "default (ACCE_VISIBLE_DEVICE_ENV_NAME)")
    env: dict[str, str] = Field(default_factory=dict)
    agent: AgentSpec | None = None
    slurm: SlurmSpec | None = Field(default=None, description="run each round as a Slurm job (flagperf.hosts.slurm)")
    expected_devices: int | None = Field(
        default=None, ge=1, le=MAX_EXPECTED_DEVICES, description="how many devices this host's rounds must find (a "
        "Slurm entry: each node's, in its job), as the vendor's probe counts them where the cases run: the host's "
        "probe, a docker host's probe in its image; another count fails the host's healthcheck. Not for an agent "
        "host with runtime: docker (its images are not probed) or a vendor with logical_devices (its count is the "
        "vendor's); null in a host's entry leaves out the one under defaults")
    spec_settings: dict[str, Any] = Field(
        default_factory=dict, description="this host's hardware facts for the vendor's spec module (cpu: clock_ghz, "
        "memory_channels, memory_mt_per_s, fma_units_per_core), over the vendor.yaml's key by key; keys the "
        "vendor.yaml declares, scalar values")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "host name")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_address(value)  # raises ValueError naming what is wrong; split in _defaults, after every field
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None, info: ValidationInfo) -> int | None:
        address = info.data.get("address")  # absent when it was refused
        in_address = split_address(address)[1] if address else None
        if value is not None and in_address is not None and value != in_address:
            raise ValueError(f"the address {address} gives port {in_address}")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", value):
            raise ValueError(f"{value!r} is not a user name")
        return value

    @field_validator("project_root")
    @classmethod
    def _project_root(cls, value: Path | None) -> Path | None:
        problem = project_root_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and (not re.fullmatch(r"[A-Za-z0-9_./+-]+", value) or value.startswith("-")):
            raise ValueError(f"{value!r} is not a program name or path")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+[bkmgBKMG]?", value):
            raise ValueError(f"{value!r} is not a size such as 32g")
        return value

    @field_validator("visible_devices")
    @classmethod
    def _visible(cls, value: str | None) -> str | None:
        ids = value.split(",") if value else []
        if not all(VISIBLE_DEVICE.fullmatch(i) for i in ids):
            raise ValueError(f"{value!r} is not a comma-separated list of device indices or UUIDs")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{value!r} names a device twice")
        return value

    @field_validator("visible_devices_env")
    @classmethod
    def _visible_env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value

    @field_validator("expected_devices", mode="before")
    @classmethod
    def _expected_devices_form(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_EXPECTED_DEVICES):
            raise ValueError(f"must be a whole number of devices, 1 to {MAX_EXPECTED_DEVICES} (e.g. 8)")
        return value

    @field_validator("expected_devices")
    @classmethod
    def _expected_devices_counted(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("runtime") == "docker" and info.data.get("agent") is not None:
            # Named: a value under defaults is refused for each agent host it reaches
            name = info.data.get("name")  # absent where the name itself was refused
            who = f"host {name}" if name else "this host"
            raise ValueError(f"{who} is an agent host, whose images are built and run by its own worker, where no "
                             "probe counts the devices its cases see: leave expected_devices out for it "
                             "(`expected_devices: null` in its entry, where defaults give one), or give it runtime: "
                             "process")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not valid")
        return value

    @field_serializer("env", when_used="json")
    def _mask_env(self, value: dict[str, str]) -> dict[str, str]:
        return mask_values(value)

    @field_validator("spec_settings")
    @classmethod
    def _spec_settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = spec_settings_problem(value)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        return value

    def host_spec_settings(self) -> HostSpecSettings | None:
        """The settings for the job of a round on this host, with the file and key that gave them."""
        if not self.spec_settings:
            return None
        source, prefix = spec_origin(self)
        return HostSpecSettings(values=self.spec_settings, source=source, key=f"{prefix}spec_settings")

    def runtime_env(self) -> dict[str, str]:
        """The environment the inventory gives this host's cases, references resolved here."""
        return resolve_values(self.env, self.name, "env")

    @model_validator(mode="after")
    def _defaults(self) -> HostSpec:
        host, port = split_address(self.address)  # a port in the address and port agree (_port)
        object.__setattr__(self, "address", host)
        if port is not None:
            object.__setattr__(self, "port", port)
        if self.slurm is not None or self.transport == "slurm":
            if self.slurm is None or self.transport not in (None, "slurm") or self.runtime != "process" or self.agent:
                raise ValueError("a Slurm entry needs a slurm: section, and runs its jobs itself (no transport, "
                                 "runtime: docker or agent; slurm.container_image runs cases in a container)")
            object.__setattr__(self, "transport", "slurm")
            for mount in self.slurm.container_mounts:  # as a docker host's data mounts and -v (container_settings)
                problem = mount_target_problem(clean_path(mount.split(":")[1], "container path"),
                                               str(self.project_root or PROJECT_ROOT), str(self.slurm.shared_dir),
                                               "slurm.shared_dir")
                if problem:
                    raise ValueError(f"slurm.container_mounts: {mount!r} is refused: its container path is {problem}")
        if self.transport is None:
            object.__setattr__(self, "transport", "local" if self.address in LOCAL_ADDRESSES else "ssh")
        if self.docker.engine is None:
            object.__setattr__(self.docker, "engine", "ssh" if self.transport == "ssh" else "local")
        if self.transport == "local" and self.docker.engine == "ssh":
            raise ValueError("docker.engine: ssh needs an SSH host")
        return self

    @property
    def queue(self) -> str | None:
        if self.agent is None:
            return None
        return self.agent.queue or f"host-{self.name}"

    def ssh_user(self) -> str:
        return self.user or getpass.getuser()

    def with_ssh_config(self) -> HostSpec:
        """User, port, key and host name from the OpenSSH client config, where this entry leaves them out
        (FlagPerf's host.yaml has none of them: it relies on ~/.ssh/config, and so may an inventory)."""
        import paramiko

        updates: dict[str, Any] = {}
        path = self.ssh_config.expanduser() if self.ssh_config else None
        if path is not None and is_present(path):  # read bounded and never blocking (a FIFO), as any config file
            source, prefix = spec_origin(self)
            text = read_config_text(path, source, f"{prefix}ssh_config", what="an SSH client config")
            found = paramiko.SSHConfig.from_text(text).lookup(self.address)
            if self.user is None and found.get("user"):
                updates["user"] = found["user"]
            if self.port is None and found.get("port"):
                updates["port"] = int(found["port"])
            if self.key_file is None and found.get("identityfile"):
                key_file = Path(found["identityfile"][0]).expanduser()
                # The key paramiko reads, as the inventory's key_file is checked (a missing one: the connection
                # says so, as for ssh's own default keys).
                problem = regular_file_problem(key_file, what="an SSH file")
                if problem and problem != "file not found":
                    raise ConfigError(source, f"{prefix}ssh_config", f"IdentityFile {key_file}: {problem}")
                updates["key_file"] = key_file
            if found.get("hostname") and found["hostname"] != self.address:
                updates["address"] = found["hostname"]
        if self.port is None and "port" not in updates:
            updates["port"] = 22
        return self.model_copy(update=updates)


class InventoryFile(StrictModel):
    vendor: str | None = None
    master_port: int = Field(default=DEFAULT_MASTER_PORT, ge=1, le=65535)
    defaults: dict[str, Any] = Field(default_factory=dict)
    hosts: list[dict[str, Any]] = Field(min_length=1)
    endpoints: dict[str, Any] = Field(
        default_factory=dict, description="running OpenAI-compatible servers a serving case names (endpoint: NAME): "
                                          "base_url, model, api_key (a ${NAME} reference only), devices, "
                                          "client_host (the host that sends the load)")


@dataclass(frozen=True)
class Inventory:
    hosts: list[HostSpec]
    source: str
    vendor: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    # From FlagPerf's host.yaml: the cases it lists, per case the framework (image folder) and data dir.
    cases: list[str] = field(default_factory=list)
    frameworks: dict[str, str] = field(default_factory=dict)
    results_dir: str | None = None
    notes: list[str] = field(default_factory=list)
    # Settings for every case that has the key (host.yaml's NPROC_PER_NODE -> nproc_per_node).
    case_overrides: dict[str, Any] = field(default_factory=dict)
    # Rounds per case where the file says (FlagPerf training's CASES repeat); --rounds wins.
    rounds: int | None = None
    # Running servers a serving case may name (its endpoint: NAME), checked by the case's config in the plan.
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resolve_vendor(self, vendor: str | None) -> str:
        """The run's vendor: as asked, else the inventory's (FlagPerf's VENDOR), else cpu; never two. The hosts'
        container options are checked against that vendor's device patterns here, before anything runs."""
        if vendor and self.vendor and vendor != self.vendor:
            raise ConfigError(self.source, "VENDOR" if self.cases else "vendor",
                              f"the inventory is for vendor {self.vendor!r}, the run asks for {vendor!r}")
        name = vendor or self.vendor or "cpu"
        if any(spec.runtime == "docker" or spec.docker.extra_options for spec in self.hosts):
            resolved = load_vendor(name)
            for spec in self.hosts:
                check_container_policy(spec, resolved)
        check_spec_settings_keys(self.hosts, name)
        check_expected_devices(self.hosts, name)
        return name

    def host(self, name: str) -> HostSpec:
        for spec in self.hosts:
            if spec.name == name:
                return spec
        raise KeyError(name)


def check_spec_settings_keys(hosts: list[HostSpec], vendor: str) -> None:
    """The hosts' spec_settings name keys the vendor's spec module reads (its vendor.yaml declares them): checked
    before anything runs, without importing the vendor's code."""
    given = [spec for spec in hosts if spec.spec_settings]
    if given:
        manifest = load_vendor(vendor).manifest
        for spec in given:
            source, prefix = spec_origin(spec)
            check_host_spec_settings(manifest, spec.spec_settings, source, f"{prefix}spec_settings")


def check_expected_devices(hosts: list[HostSpec], vendor: str) -> None:
    """A host's expected_devices is a count its probe can find: not under a vendor that splits the CPU into
    logical_devices (its rounds' devices are the vendor.yaml's count, whatever the host has)."""
    given = [spec for spec in hosts if spec.expected_devices is not None]
    if not given:
        return
    resolved = load_vendor(vendor)
    logical = resolved.manifest.logical_devices
    if logical is None:
        return
    source, key = expected_devices_origin(given[0])
    raise ConfigError(source, key, f"vendor {vendor} splits the host's CPU into "
                      f"logical_devices: {logical} ({display_path(resolved.folder / VENDOR_MANIFEST)}): its rounds "
                      "measure that many whatever the host has, so there is no count to check; leave it out")


def mask_values(values: dict[str, str]) -> dict[str, str]:
    """References stay (they name a variable, not its value); literal values are masked."""
    return {name: value if REFERENCE.match(value) else MASK for name, value in values.items()}


def mask_container_options(text: str) -> str:
    tokens = shlex.split(text)
    for i, token in enumerate(tokens):
        option, eq, value = token.partition("=")
        if option in ("-e", "--env") and eq and "=" in value:  # --env=NAME=VALUE
            tokens[i] = f"{option}={value.partition('=')[0]}={MASK}"
        elif token in ("-e", "--env") and i + 1 < len(tokens) and "=" in tokens[i + 1]:
            tokens[i + 1] = f"{tokens[i + 1].partition('=')[0]}={MASK}"
    return shlex.join(tokens)


def resolve_values(values: dict[str, str], host: str, key: str) -> dict[str, str]:
    import os

    resolved: dict[str, str] = {}
    for name, value in values.items():
        if value == MASK:
            raise ConfigError(f"host {host}", f"{key}.{name}", "given literally in the inventory, and literal values "
                              "are never sent to a host's worker: write ${VARIABLE} and set it in its environment")
        ref = REFERENCE.match(value)
        if ref and ref.group(1) not in os.environ:
            raise ConfigError(f"host {host}", f"{key}.{name}", f"refers to ${{{ref.group(1)}}}, which is not set")
        resolved[name] = os.environ[ref.group(1)] if ref else value
    return resolved


# The specs loaded in this process, by their masked form: a subflow given a masked spec as its parameter
# gets the real one back (a worker on another machine does not: literal values never leave the controller).
_LOADED: dict[str, HostSpec] = {}
# Where each of those specs was written: (inventory file, key prefix), for errors found later (on the host).
_ORIGINS: dict[str, tuple[str, str]] = {}


def spec_origin(spec: HostSpec) -> tuple[str, str]:
    """(the inventory file, "hosts.<i>.") a spec was loaded from; (host <name>, "") when not in this process."""
    return _ORIGINS.get(spec.model_dump_json(), (f"host {spec.name}", ""))


# Where each of those specs' expected_devices was written (hosts.<i>.expected_devices or defaults.expected_devices):
# a count found wrong on the host names the line to change.
_COUNT_KEYS: dict[str, str] = {}


def expected_devices_origin(spec: HostSpec) -> tuple[str, str]:
    """(the inventory file, the key) a spec's expected_devices was written at, as spec_origin."""
    source, prefix = spec_origin(spec)
    return source, _COUNT_KEYS.get(spec.model_dump_json(), f"{prefix}expected_devices")


def check_container_policy(spec: HostSpec, vendor: Vendor) -> None:
    """A host's container options against the run vendor's device patterns (--device in docker.extra_options,
    the vendor's own devices): ConfigError naming the file and key, before anything runs."""
    patterns = list(vendor.manifest.container.device_patterns)
    source, prefix = spec_origin(spec)
    try:
        parse_container_options(spec.docker.extra_options or "", spec.docker.allowed_roots(), patterns)
    except PolicyError as exc:
        raise ConfigError(source, f"{prefix}docker.extra_options", str(exc)) from None
    for i, device in enumerate(vendor.manifest.container.devices if spec.runtime == "docker" else []):
        try:
            check_device(device, patterns)
        except PolicyError as exc:
            raise ConfigError(display_path(vendor.folder / "vendor.yaml"), f"container.devices.{i}", str(exc)) from None


def check_mount_places(spec: HostSpec, data_mounts: Sequence[Mount], volumes: Sequence[Mount], project: str,
                       work: str | None) -> None:
    """A docker host's data mounts and -v mounts (``volumes``) against what FlagPerf mounts itself
    (mount_target_problem) and, read-write, against the host's work root ``work`` (work_root_source_problem: the
    controller's ended markers): ConfigError naming the file and key."""
    source, prefix = spec_origin(spec)
    for i, mount in enumerate(data_mounts):
        problem = mount_target_problem(mount.target, project, work)
        if problem:
            raise ConfigError(source, f"{prefix}docker.data_mounts.{i}",
                              f"data mount {mount.target!r} is refused: it is {problem}")
    for mount in volumes:
        problem = mount_target_problem(mount.target, project, work)
        if problem:
            raise ConfigError(source, f"{prefix}docker.extra_options",
                              f"-v container path {mount.target!r} is refused: it is {problem}")
    # Its source too, where it is written: the work root, above it or in it, read-write (the ended markers)
    for key, what, mount in (*((f"docker.data_mounts.{i}", "data mount", m) for i, m in enumerate(data_mounts)),
                             *(("docker.extra_options", "-v host path", m) for m in volumes)):
        problem = None if mount.read_only else work_root_source_problem(mount.source, work)
        if problem:
            raise ConfigError(source, f"{prefix}{key}", f"{what} {mount.source!r} is refused read-write: {problem}")


def split_address(value: str) -> tuple[str, int | None]:
    """A host's address as (host, port): a host name, an IPv4 or IPv6 address (bare or in brackets), each
    with an optional :port (an IPv6 address in brackets then). ValueError names what is wrong, so that a
    bad one is refused with the inventory, not after a server started and the healthcheck timed out."""
    if not ADDRESS_CHARACTERS.fullmatch(value):
        raise ValueError(f"{value!r} is not a host name or IP address")
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::([^:]*))?", value)
    if bracketed:
        host, port = bracketed.group(1), bracketed.group(2)
        _ip_address(host, 6, value)
    elif value.count(":") > 1:  # a bare IPv6 address: no port without brackets
        host, port = value, None
        _ip_address(host, 6, value)
    else:
        host, colon, port_text = value.partition(":")
        port = port_text if colon else None
        if IPV4_LIKE.fullmatch(host):
            _ip_address(host, 4, value)
        elif len(host) > MAX_HOST_NAME or not all(HOST_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError(f"{_within(host, value)} is not a host name or IP address")
    if port is None:
        return host, None
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} in {value!r} is not a port number (1 to 65535)")
    return host, int(port)


def _ip_address(host: str, version: int, value: str) -> None:
    try:
        (ipaddress.IPv6Address if version == 6 else ipaddress.IPv4Address)(host)
    except ValueError:
        raise ValueError(f"{_within(host, value)} is not an IPv{version} address") from None


def _port_in(address: object) -> bool:
    try:
        return isinstance(address, str) and split_address(address)[1] is not None
    except ValueError:
        return False  # refused with the host's other keys


def _within(host: str, value: str) -> str:
    return repr(host) if host == value else f"{host!r} in {value!r}"


def host_spec(data: dict[str, Any]) -> HostSpec:
    """A host spec from its written-down (masked) form, with its real values when this process loaded it."""
    spec = HostSpec.model_validate(data)
    return _LOADED.get(spec.model_dump_json(), spec)


def local_inventory() -> Inventory:
    """The embedded default: the controller machine, plain processes, no SSH."""
    return Inventory(hosts=[HostSpec(name="localhost", transport="local")], source="(embedded default)")


def _expand(spec: HostSpec, base: Path) -> HostSpec:
    """~ and relative key/known_hosts paths are taken from the controller's view (relative to the file)."""
    updates: dict[str, Any] = {}
    for key in ("key_file", "known_hosts", "ssh_config"):
        value = getattr(spec, key)
        if value is not None:
            path = Path(value).expanduser()
            updates[key] = path if path.is_absolute() else (base / path).resolve()
    return spec.model_copy(update=updates)


def _check_ssh_files(spec: HostSpec, source: str, prefix: str) -> None:
    """The files paramiko reads for an SSH host (its key, known_hosts, the client config), and its key wherever
    given: regular files of a config file's size where present, so that a FIFO, a device or a huge file is refused
    here in one line instead of blocking or filling memory when the host is reached."""
    optional = ("known_hosts", "ssh_config") if spec.transport == "ssh" else ()
    for key in ("key_file", *optional):
        value = getattr(spec, key)
        path = value.expanduser() if value is not None else None
        if path is None or (key in optional and not is_present(path)):
            continue  # no known_hosts yet (accept_new_host_key makes it), or no client config: nothing read
        problem = regular_file_problem(path, what="an SSH file")
        if problem == "file not found":
            raise ConfigError(source, f"{prefix}{key}", f"{path} does not exist")
        if problem:
            raise ConfigError(source, f"{prefix}{key}", f"{path}: {problem}")


def _entry_key(key: str | None, entry: dict[str, Any], defaults: dict[str, Any], index: int) -> str:
    """Where a host's merged key was written: its own entry (hosts.<i>.key), or the defaults (defaults.key)."""
    if not key:
        return f"hosts.{index}"
    top, _, rest = key.partition(".")
    own = entry.get(top)
    from_defaults = top in defaults and (top not in entry or (
        isinstance(own, dict) and rest and rest.split(".")[0] not in own and rest.split(".")[0] in defaults[top]))
    return f"defaults.{key}" if from_defaults else f"hosts.{index}.{key}"


def build_inventory(data: dict[str, Any], source: str, base: Path) -> Inventory:
    try:
        parsed = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise _suite_hint(pydantic_error_to_config_error(exc, source, model=InventoryFile), data) from None
    problems: list[ConfigError] = []  # every host entry's and endpoint's findings, all at once
    if parsed.vendor is not None:
        try:
            check_vendor(parsed.vendor, source, "vendor")
        except ConfigError as exc:
            problems.append(exc)
    hosts: list[HostSpec] = []
    entries: list[int] = []  # each host's entry in the file (a Slurm entry stands for several hosts)
    for i, entry in enumerate(parsed.hosts):
        try:
            slots = _host_entry(parsed, i, entry, source)
        except ConfigError as exc:
            problems.append(exc)
            continue
        hosts.extend(_expand(slot, base) for slot in slots)
        entries += [i] * len(slots)
    for name, entry in parsed.endpoints.items():
        try:
            _check_endpoint(name, entry, source)
        except ConfigError as exc:
            problems.append(exc)
    if problems:
        raise gathered(problems)
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(source, "hosts", f"host names must be unique: {', '.join(duplicates)}")
    for name, entry in parsed.endpoints.items():  # checked above: a mapping that is an Endpoint
        client = entry.get("client_host")
        if client is not None and client not in names:
            raise ConfigError(source, f"endpoints.{name}.client_host", f"{client!r} names no host of the inventory "
                              f"({', '.join(names)})")
    for i, spec in zip(entries, hosts, strict=True):
        _check_ssh_files(spec, source, f"hosts.{i}.")
        if spec.agent is None:  # the controller starts this host's cases: its references must resolve here
            for key, values in (("env", spec.env), ("docker.build_args", spec.docker.build_args)):
                try:
                    resolve_values(values, spec.name, key)
                except ConfigError as exc:
                    raise ConfigError(source, f"hosts.{i}.{exc.key}", exc.message) from None
        _LOADED[spec.model_dump_json()] = spec
        _ORIGINS[spec.model_dump_json()] = (source, f"hosts.{i}.")
        _COUNT_KEYS[spec.model_dump_json()] = _entry_key("expected_devices", parsed.hosts[i], parsed.defaults, i)
        if spec.runtime == "docker" and spec.work_root is not None:
            # Where its mounts go and what they may write, as container_settings checks them, so that `flagperf
            # validate` and a run's start refuse them, not a round once the image is built (a work root the entry
            # does not write is the host's own default: known only there). The options' form was checked above.
            roots = spec.docker.allowed_roots()
            check_mount_places(spec, [parse_data_mount(entry, roots) for entry in spec.docker.data_mounts],
                               parse_container_options(spec.docker.extra_options or "", roots).mounts,
                               str(spec.project_root or PROJECT_ROOT), str(spec.work_root))
    if parsed.vendor is not None:  # also where the file is only validated (flagperf validate)
        check_spec_settings_keys(hosts, parsed.vendor)
        check_expected_devices(hosts, parsed.vendor)
    return Inventory(hosts=hosts, source=source, vendor=parsed.vendor, master_port=parsed.master_port,
                     endpoints=dict(parsed.endpoints))


# The top-level keys of a suite file (flagperf.config.models.SuiteFile) that an inventory does not have: a suite
# given where an inventory is expected is named as such.
SUITE_KEYS = frozenset(SuiteFile.model_fields)


def _suite_hint(error: ConfigError, data: dict[str, Any]) -> ConfigError:
    """An unknown top-level key of a file that looks like a suite (its keys, no hosts): said so, instead of the
    inventory's keys."""
    if not looks_like_suite(data) or error.key not in SUITE_KEYS:
        return error
    return gathered([ConfigError(error.source, error.key, "unknown key (this looks like a suite file; --inventory "
                                                          "takes an inventory: hosts, defaults, vendor)"), *error.more])


def _host_entry(parsed: InventoryFile, i: int, entry: dict[str, Any], source: str) -> list[HostSpec]:
    """The hosts of entry ``i`` (a Slurm entry stands for several), its defaults merged in; its findings, each
    keyed where it was written (hosts.<i>.key or defaults.key)."""
    merged = {**parsed.defaults, **entry}
    if "port" not in entry and _port_in(entry.get("address")):
        merged.pop("port", None)  # a port written in the host's own address wins over the defaults'
    for section in ("docker", "spec_settings"):  # merged key by key: a host sets what differs from the defaults
        if isinstance(parsed.defaults.get(section), dict) and isinstance(entry.get(section), dict):
            merged[section] = {**parsed.defaults[section], **entry[section]}
    settings = merged.get("spec_settings")
    problem = spec_settings_problem(settings) if isinstance(settings, dict) else None
    if problem:  # here, where the key is known: the model's own check names only spec_settings
        key = f"hosts.{i}.spec_settings" if problem[0] in (entry.get("spec_settings") or {}) \
            else "defaults.spec_settings"
        raise ConfigError(source, f"{key}.{problem[0]}", problem[1])
    try:
        spec = HostSpec.model_validate(merged)
        slots = [HostSpec.model_validate(slot.model_dump()) for slot in slurm_slots(spec)]  # a Slurm entry's nodes
    except ValidationError as exc:
        error = pydantic_error_to_config_error(exc, source, model=HostSpec)
        raise gathered(ConfigError(source, _entry_key(finding.key, entry, parsed.defaults, i), finding.message)
                       for finding in [error, *error.more]) from None
    problem = slurm_entry_problem(spec.env) if spec.slurm is not None else None
    if problem:
        raise ConfigError(source, f"hosts.{i}.{problem[0]}", problem[1])
    # A remote host left without project_root uses the controller's own folder, which holds to the same rule.
    default_problem = (project_root_problem(PROJECT_ROOT)
                       if spec.project_root is None and spec.transport != "local" else None)
    if default_problem:
        raise ConfigError(source, f"hosts.{i}.project_root", "not given, and the default, this project's folder "
                          f"on the controller, cannot be a host's: {default_problem}; give project_root")
    return slots


def _check_endpoint(name: str, entry: Any, source: str) -> None:
    try:
        check_name(name, "endpoint name")
    except ValueError as exc:
        raise ConfigError(source, f"endpoints.{name}", str(exc)) from None
    if not isinstance(entry, dict):  # not quoted: a URL with a password written in its place is still one
        raise ConfigError(source, f"endpoints.{name}", "must be a mapping (base_url, model, api_key, devices, "
                                                       "client_host)")
    try:  # here, not only when a case names it: a literal key must not sit in an inventory unnoticed
        Endpoint.model_validate(entry)
    except ValidationError as exc:
        error = pydantic_error_to_config_error(exc, source, model=Endpoint)
        raise gathered(ConfigError(source, f"endpoints.{name}.{finding.key}" if finding.key else f"endpoints.{name}",
                                   finding.message) for finding in [error, *error.more]) from None


def load_inventory(path: Path) -> Inventory:
    """A native inventory, or FlagPerf's host.yaml (recognised by its upper-case HOSTS key)."""
    data = load_yaml_mapping(path)
    if "HOSTS" in data:
        return host_yaml_inventory(data, display_path(path), path.parent)
    return build_inventory(data, display_path(path), path.parent)


# ---------------------------------------------------------------------------------------------- host.yaml

def check_vendor(name: str, source: str, key: str) -> None:
    """The inventory's vendor exists (else the run would blame a --vendor nobody gave)."""
    known = available_vendors()
    if name not in known:
        raise ConfigError(source, key, unknown_name("vendor", name, known, "flagperf list vendors"))


def visible_env_note(vendor: str, given: str, where: str) -> str | None:
    """FlagPerf's ACCE_VISIBLE_DEVICE_ENV_NAME (``given``, written at ``where``) against the vendor's
    container.visible_devices_env: a round narrows each of its devices with the vendor's variable (measure.fanout),
    the FlagPerf file's only names the one a host's visible_devices sets, which neither FlagPerf file can set; so a
    name that differs is said, in one line, rather than silently not used. None when they agree, when the vendor
    has no devices a round narrows by a variable (torch_device cpu, or logical_devices: its devices are the host's
    cores, pinned, not named by a variable), or when its vendor.yaml does not load (the run says why)."""
    try:
        vendor_def = load_vendor(vendor)
    except FlagperfError:
        return None
    manifest_def = vendor_def.manifest
    theirs = manifest_def.container.visible_devices_env
    if theirs == given or (theirs is None and (manifest_def.torch_device == "cpu"
                                               or manifest_def.logical_devices is not None)):
        return None
    manifest = display_path(vendor_def.folder / VENDOR_MANIFEST)
    if theirs is None:  # a device vendor that names no variable: its rounds narrow nothing, though FlagPerf did
        return (f"{where}: ACCE_VISIBLE_DEVICE_ENV_NAME: {given}, but vendor {vendor} names no visible-devices variable"
                f" ({manifest}: container.visible_devices_env): a round does not narrow each device by {given}; "
                f"add `visible_devices_env: {given}` under container: there")
    return (f"{where}: ACCE_VISIBLE_DEVICE_ENV_NAME: {given}, but vendor {vendor}'s is {theirs} ({manifest}: "
            f"container.visible_devices_env): a round narrows each device by {theirs}; give the same name in both")


def inference_case(name: str, known: dict[str, Path], source: str, key: str) -> str:
    """The inference case a FlagPerf inference host.yaml names: FlagPerf's name (resnet50, bertLarge, vit_l_16)
    or this project's (resnet50-infer), never a case of another family with the same name."""
    kebab = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).replace("_", "-").lower()
    for candidate in dict.fromkeys((name, f"{name}-infer", kebab, f"{kebab}-infer")):
        if candidate in known and known[candidate].parent.name == "inference":
            return candidate
    inference = sorted(n for n, folder in known.items() if folder.parent.name == "inference")
    raise ConfigError(source, key, f"no inference case {name!r} (a data folder names an inference case; "
                                   f"inference cases: {', '.join(inference) or 'none'})")


HOST_YAML_KEYS = {
    "FLAGPERF_PATH", "FLAGPERF_LOG_PATH", "VENDOR", "FLAGPERF_LOG_LEVEL", "LOG_CALL_INFORMATION", "HOSTS",
    "SSH_PORT", "HOSTS_PORTS", "MASTER_PORT", "SHM_SIZE", "ACCE_CONTAINER_OPT", "PIP_SOURCE", "CLEAR_CACHES",
    "ACCE_VISIBLE_DEVICE_ENV_NAME", "CASES", "BENCHMARKS_OR_TOOLKITS", "NPROC_PER_NODE",
}
# Keys that FlagPerf uses for things this engine does differently; accepted, and the run says so.
HOST_YAML_NOT_USED = {
    "FLAGPERF_LOG_LEVEL": "log levels are the Prefect logging settings",
    "LOG_CALL_INFORMATION": "every log line carries its logger name",
    "HOSTS_PORTS": "no sshd is started inside containers",
    "PIP_SOURCE": "images are built from the vendor's Dockerfile (set a mirror there or in pip.conf)",
    "CLEAR_CACHES": "page caches are not dropped (it needs root on every host)",
    "BENCHMARKS_OR_TOOLKITS": "a case's entry decides between a PyTorch kernel and a vendor tool",
}


def host_yaml_inventory(data: dict[str, Any], source: str, base: Path) -> Inventory:
    """FlagPerf's host.yaml with FlagPerf's meaning: HOSTS[0] is the master, every host runs containers
    from vendor_images/<VENDOR>/<framework>/ with SHM_SIZE and ACCE_CONTAINER_OPT, the visible-devices
    variable named by ACCE_VISIBLE_DEVICE_ENV_NAME. CASES maps "<case>[:<chip>]" to a framework
    (base), or "<case>:<framework>" to a data folder mounted into the container (inference)."""
    unknown = sorted(set(data) - HOST_YAML_KEYS)
    if unknown:
        raise ConfigError(source, unknown[0], "unknown key in a FlagPerf host.yaml")
    hosts = data.get("HOSTS")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ConfigError(source, "HOSTS", "must be a non-empty list of addresses")
    vendor = data.get("VENDOR")
    if not isinstance(vendor, str):
        raise ConfigError(source, "VENDOR", "must be a vendor name")
    check_vendor(vendor, source, "VENDOR")

    def port(key: str, default: int) -> int:
        value = data.get(key, default)
        try:
            number = int(str(value))
        except ValueError:
            raise ConfigError(source, key, f"must be a port number, got {value!r}") from None
        if not 1 <= number <= 65535:
            raise ConfigError(source, key, f"must be a port number, got {value!r}")
        return number

    docker: dict[str, Any] = {}
    if data.get("ACCE_CONTAINER_OPT"):
        docker["extra_options"] = str(data["ACCE_CONTAINER_OPT"])
        patterns = list(load_vendor(vendor).manifest.container.device_patterns)
        try:
            parse_container_options(docker["extra_options"], allowed_roots(), patterns)
        except ValueError as exc:
            raise ConfigError(source, "ACCE_CONTAINER_OPT", str(exc)) from None
    cases: list[str] = []
    frameworks: dict[str, str] = {}
    case_overrides: dict[str, Any] = {}
    notes: list[str] = []
    raw_cases = data.get("CASES") or {}
    if not isinstance(raw_cases, dict) or not raw_cases:
        raise ConfigError(source, "CASES", "must map case names to a framework or a data folder")
    known = available_cases()
    for key, value in raw_cases.items():
        name, _, suffix = str(key).partition(":")
        if not isinstance(value, str):
            raise ConfigError(source, f"CASES.{key}", "must be a framework name or a data folder")
        try:
            check_name(name, "case name")
        except ValueError as exc:
            raise ConfigError(source, f"CASES.{key}", str(exc)) from None
        if value.startswith("/"):  # inference style: "<case>:<framework>": data dir, as FlagPerf's inference/
            framework = suffix.split("_")[0] or "pytorch"
            name = inference_case(name, known, source, f"CASES.{key}")
            try:
                parse_data_mount(value, allowed_roots())
            except PolicyError as exc:
                raise ConfigError(source, f"CASES.{key}", str(exc)) from None
            docker.setdefault("data_mounts", []).append(value)
            if "data_dir" in load_case(name, known).config_model.model_fields:
                case_overrides[f"{name}.data_dir"] = value  # where FlagPerf's run_inference.py gets --data_dir
            else:
                notes.append(f"{source}: CASES.{key}: {name} reads no data_dir; {value} is only mounted")
        else:  # base style: "<case>[:<chip>]": framework (pytorch, pytorch_2.3 -> the pytorch image)
            framework = value.split("_")[0]
            if name not in known:
                raise ConfigError(source, f"CASES.{key}", unknown_name("case", name, known, "flagperf list cases"))
        try:
            check_name(framework, "framework")
        except ValueError as exc:
            raise ConfigError(source, f"CASES.{key}", str(exc)) from None
        cases.append(name)
        frameworks[name] = framework
    visible_env = data.get("ACCE_VISIBLE_DEVICE_ENV_NAME")
    if visible_env is not None and not ENV_NAME.match(str(visible_env)):
        raise ConfigError(source, "ACCE_VISIBLE_DEVICE_ENV_NAME", f"{visible_env!r} is not a variable name")
    defaults: dict[str, Any] = {"port": port("SSH_PORT", 22), "runtime": "docker", "docker": docker}
    if visible_env is not None:
        defaults["visible_devices_env"] = str(visible_env)
        differs = visible_env_note(vendor, str(visible_env), source)
        if differs:
            notes.append(differs)
    if data.get("SHM_SIZE"):
        defaults["shm_size"] = str(data["SHM_SIZE"]).lower()
    if data.get("FLAGPERF_PATH"):
        project_root = data["FLAGPERF_PATH"]
        problem = project_root_problem(project_root) if isinstance(project_root, str) else "must be a folder's path"
        if problem:  # named as written here, not as the hosts' project_root it becomes
            raise ConfigError(source, "FLAGPERF_PATH", problem)
        defaults["project_root"] = project_root
    specs = []
    for i, address in enumerate(hosts):
        try:
            host, host_port = split_address(address)
        except ValueError as exc:
            raise ConfigError(source, f"HOSTS.{i}", str(exc)) from None
        # FlagPerf names a host by its address; a port in it (not FlagPerf's form) is that host's SSH_PORT.
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", address).strip("_.-") or f"host{i}"
        specs.append({"name": name, "address": host, **({"port": host_port} if host_port is not None else {})})
    inventory = build_inventory({"vendor": vendor, "master_port": port("MASTER_PORT", DEFAULT_MASTER_PORT),
                                 "defaults": defaults, "hosts": specs}, source, base)
    if "NPROC_PER_NODE" in data:
        nproc = data["NPROC_PER_NODE"]
        if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 1024:
            raise ConfigError(source, "NPROC_PER_NODE", f"must be a whole number of processes, got {nproc!r}")
        case_overrides["nproc_per_node"] = nproc  # for the cases that start several processes per host
    notes += [f"{source}: {key} is not used: {why}" for key, why in HOST_YAML_NOT_USED.items() if key in data]
    log_path = data.get("FLAGPERF_LOG_PATH")
    return Inventory(hosts=inventory.hosts, source=source, vendor=vendor, master_port=inventory.master_port,
                     cases=cases, frameworks=frameworks, notes=notes, results_dir=str(log_path) if log_path else None,
                     case_overrides=case_overrides)

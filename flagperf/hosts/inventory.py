"""Inventories: which hosts an evaluation runs on and how each is reached.

Two formats, one model:
  * the native inventory (YAML, see deployments/inventories/example.yaml): ``defaults`` + ``hosts``;
  * FlagPerf's own host.yaml (HOSTS, SSH_PORT, VENDOR, CASES, SHM_SIZE, ACCE_CONTAINER_OPT,
    ACCE_VISIBLE_DEVICE_ENV_NAME, MASTER_PORT ...), read with FlagPerf's meaning by ``load_host_yaml``.
No secrets live here: keys are file paths (or the SSH agent), passwords are not accepted.
"""

from __future__ import annotations

import getpass
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from flagperf.config.models import StrictModel, check_name, pydantic_error_to_config_error
from flagperf.config.yamlio import load_yaml_mapping
from flagperf.errors import ConfigError
from flagperf.paths import display_path

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Host names and addresses reach ssh/paramiko and docker labels: no spaces, no option-like leading '-'.
ADDRESS = re.compile(r"^[A-Za-z0-9_.:\[\]%-]+$")
DEFAULT_MASTER_PORT = 29501
LOCAL_ADDRESSES = ("local", "localhost", "127.0.0.1")


class DockerSpec(StrictModel):
    """How a host's container engine is reached and what images are built from."""

    engine: Literal["local", "ssh"] | None = Field(
        default=None, description="local: the controller's engine socket (DOCKER_HOST or the default); ssh: the "
                                  "host's own engine through the host's SSH connection. Default: ssh for SSH "
                                  "hosts, local for the local host")
    base_url: str | None = Field(default=None, description="engine URL for engine: local (unix:///..., tcp://...)")
    build_args: dict[str, str] = Field(default_factory=dict, description="e.g. BASE_IMAGE for a local base image")
    data_mounts: list[str] = Field(default_factory=list, description="host folders mounted read-only at the "
                                                                     "same path (datasets, weights)")
    extra_options: str | None = Field(default=None, description="FlagPerf's ACCE_CONTAINER_OPT, e.g. ' --gpus all'")

    @field_validator("build_args")
    @classmethod
    def _arg_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"build arg name {name!r} is not a valid name")
        return value

    @field_validator("data_mounts")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/") or ":" in path:
                raise ValueError(f"data mount {path!r} must be an absolute path without ':'")
        return value


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
    transport: Literal["local", "ssh"] | None = Field(
        default=None, description="local: the controller itself; ssh: through paramiko (default unless the "
                                  "address is local/localhost/127.0.0.1)")
    port: int | None = Field(default=None, ge=1, le=65535, description="22 unless ~/.ssh/config says otherwise")
    user: str | None = Field(default=None, description="yours unless ~/.ssh/config says otherwise")
    key_file: Path | None = Field(default=None, description="private key file; none: the SSH agent and "
                                                            "~/.ssh/id_* keys")
    known_hosts: Path = Field(default=Path("~/.ssh/known_hosts"))
    ssh_config: Path | None = Field(default=Path("~/.ssh/config"), description="OpenSSH client config read for "
                                    "User, Port, IdentityFile and HostName where this file leaves them out")
    accept_new_host_key: bool = Field(default=False, description="trust and record a host key seen for the first "
                                                                 "time (a changed key is always refused)")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    command_timeout_s: float = Field(default=120.0, gt=0, description="limit for the engine's own small commands")
    project_root: Path | None = Field(default=None, description="where the project is deployed on the host "
                                                                "(FlagPerf's FLAGPERF_PATH); the controller's by "
                                                                "default")
    python: str | None = Field(default=None, description="the host's Python with the project's dependencies")
    work_root: Path | None = Field(default=None, description="scratch space on the host")
    runtime: Literal["process", "docker"] = "process"
    docker: DockerSpec = Field(default_factory=DockerSpec)
    shm_size: str | None = Field(default=None, description="container shared memory; the vendor's by default")
    visible_devices: str | None = Field(default=None, description="value for the visible-devices variable")
    visible_devices_env: str | None = Field(default=None, description="that variable's name; the vendor's by "
                                                                      "default (ACCE_VISIBLE_DEVICE_ENV_NAME)")
    env: dict[str, str] = Field(default_factory=dict)
    agent: AgentSpec | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "host name")

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not ADDRESS.match(value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a host name or address")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", value):
            raise ValueError(f"{value!r} is not a user name")
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

    @field_validator("visible_devices_env")
    @classmethod
    def _visible_env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r} is not valid")
        return value

    @model_validator(mode="after")
    def _defaults(self) -> HostSpec:
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
        if path is not None and path.is_file():
            found = paramiko.SSHConfig.from_path(str(path)).lookup(self.address)
            if self.user is None and found.get("user"):
                updates["user"] = found["user"]
            if self.port is None and found.get("port"):
                updates["port"] = int(found["port"])
            if self.key_file is None and found.get("identityfile"):
                updates["key_file"] = Path(found["identityfile"][0]).expanduser()
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

    def resolve_vendor(self, vendor: str | None) -> str:
        """The run's vendor: as asked, else the inventory's (FlagPerf's VENDOR), else cpu; never two."""
        if vendor and self.vendor and vendor != self.vendor:
            raise ConfigError(self.source, "VENDOR" if self.cases else "vendor",
                              f"the inventory is for vendor {self.vendor!r}, the run asks for {vendor!r}")
        return vendor or self.vendor or "cpu"

    def host(self, name: str) -> HostSpec:
        for spec in self.hosts:
            if spec.name == name:
                return spec
        raise KeyError(name)


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


def build_inventory(data: dict[str, Any], source: str, base: Path) -> Inventory:
    try:
        parsed = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error_to_config_error(exc, source) from None
    hosts: list[HostSpec] = []
    for i, entry in enumerate(parsed.hosts):
        merged = {**parsed.defaults, **entry}
        if "docker" in parsed.defaults and "docker" in entry:
            merged["docker"] = {**parsed.defaults["docker"], **entry["docker"]}
        try:
            spec = HostSpec.model_validate(merged)
        except ValidationError as exc:
            error = pydantic_error_to_config_error(exc, source)
            raise ConfigError(source, f"hosts.{i}.{error.key}" if error.key else f"hosts.{i}", error.message) from None
        hosts.append(_expand(spec, base))
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(source, "hosts", f"host names must be unique: {', '.join(duplicates)}")
    for i, spec in enumerate(hosts):
        if spec.key_file is not None and not spec.key_file.is_file():
            raise ConfigError(source, f"hosts.{i}.key_file", f"{spec.key_file} does not exist")
    return Inventory(hosts=hosts, source=source, vendor=parsed.vendor, master_port=parsed.master_port)


def load_inventory(path: Path) -> Inventory:
    """A native inventory, or FlagPerf's host.yaml (recognised by its upper-case HOSTS key)."""
    data = load_yaml_mapping(path)
    if "HOSTS" in data:
        return host_yaml_inventory(data, display_path(path), path.parent)
    return build_inventory(data, display_path(path), path.parent)


# ---------------------------------------------------------------------------------------------- host.yaml

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
        try:
            parse_container_options(docker["extra_options"])
        except ValueError as exc:
            raise ConfigError(source, "ACCE_CONTAINER_OPT", str(exc)) from None
    cases: list[str] = []
    frameworks: dict[str, str] = {}
    raw_cases = data.get("CASES") or {}
    if not isinstance(raw_cases, dict) or not raw_cases:
        raise ConfigError(source, "CASES", "must map case names to a framework or a data folder")
    for key, value in raw_cases.items():
        name, _, suffix = str(key).partition(":")
        if not isinstance(value, str):
            raise ConfigError(source, f"CASES.{key}", "must be a framework name or a data folder")
        if value.startswith("/"):  # inference style: "<case>:<framework>": data dir
            framework = suffix.split("_")[0] or "pytorch"
            docker.setdefault("data_mounts", []).append(value)
        else:  # base style: "<case>[:<chip>]": framework (pytorch, pytorch_2.3 -> the pytorch image)
            framework = value.split("_")[0]
        try:
            check_name(name, "case name")
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
    if data.get("SHM_SIZE"):
        defaults["shm_size"] = str(data["SHM_SIZE"]).lower()
    if data.get("FLAGPERF_PATH"):
        defaults["project_root"] = str(data["FLAGPERF_PATH"])
    specs = [{"name": address.replace(":", "_"), "address": address} for address in hosts]
    inventory = build_inventory({"vendor": vendor, "master_port": port("MASTER_PORT", DEFAULT_MASTER_PORT),
                                 "defaults": defaults, "hosts": specs}, source, base)
    case_overrides: dict[str, Any] = {}
    if "NPROC_PER_NODE" in data:
        nproc = data["NPROC_PER_NODE"]
        if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= 1024:
            raise ConfigError(source, "NPROC_PER_NODE", f"must be a whole number of processes, got {nproc!r}")
        case_overrides["nproc_per_node"] = nproc  # for the cases that start several processes per host
    notes = [f"{source}: {key} is not used: {why}" for key, why in HOST_YAML_NOT_USED.items() if key in data]
    log_path = data.get("FLAGPERF_LOG_PATH")
    return Inventory(hosts=inventory.hosts, source=source, vendor=vendor, master_port=inventory.master_port,
                     cases=cases, frameworks=frameworks, notes=notes, results_dir=str(log_path) if log_path else None,
                     case_overrides=case_overrides)


# ------------------------------------------------------------------------------------ container options

@dataclass
class ContainerExtras:
    """docker run options from FlagPerf's ACCE_CONTAINER_OPT, parsed (never passed to a shell)."""

    gpus: str | None = None
    devices: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    ipc: str | None = None
    group_add: list[str] = field(default_factory=list)


def parse_container_options(text: str) -> ContainerExtras:
    """The docker-run options FlagPerf's vendors use in ACCE_CONTAINER_OPT; anything else is refused by name."""
    extras = ContainerExtras()
    tokens = shlex.split(text)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option, eq, inline = token.partition("=")
        takes_value = option in ("--gpus", "--device", "-e", "--env", "-v", "--volume", "--ipc", "--group-add")
        if option == "--privileged":
            raise ValueError("--privileged is refused here: a vendor file declares a privileged container, with "
                             "privileged_reason saying why")
        if not takes_value:
            raise ValueError(f"unsupported docker option {token!r} (supported: --gpus, --device, -e/--env, "
                             "-v/--volume, --ipc, --group-add)")
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ValueError(f"{option} needs a value")
            value = tokens[i + 1]
            i += 2
        if option == "--gpus":
            extras.gpus = value
        elif option == "--device":
            extras.devices.append(value)
        elif option in ("-e", "--env"):
            name, sep, val = value.partition("=")
            if not sep or not ENV_NAME.match(name):
                raise ValueError(f"{option} {value!r} must be NAME=VALUE")
            extras.env[name] = val
        elif option in ("-v", "--volume"):
            extras.mounts.append(value)
        elif option == "--ipc":
            extras.ipc = value
        else:
            extras.group_add.append(value)
    return extras

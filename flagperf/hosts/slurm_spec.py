"""The inventory model of a Slurm place to run (an entry with ``slurm:``), and its slots.

An entry of N nodes (``nodes: N`` or ``nodelist: [...]``) becomes N hosts ("slots") in the inventory, so that
a single-node case runs on each of them (one Slurm job each) and an nnodes-node case runs on the first nnodes
slots together, as one Slurm job whose srun steps give each node its rank. Nothing here runs a Slurm tool:
flagperf/hosts/slurm.py does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from flagperf.config.models import StrictModel
from flagperf.hosts.container_policy import PolicyError, clean_path

# What Slurm names look like (partitions, accounts, QOS, nodes): no spaces, quotes, commas or a leading '-'.
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
GRES = re.compile(r"[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:[0-9]+)?(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:[0-9]+)?)*")
CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,()\[\]*:!-]{1,256}")
IMAGE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./:@#+-]{0,511}")  # docker://-less pyxis names, relative sqsh files
# An absolute squash file (enroot import's output): no segment starts with '.', so none is '..'.
SQUASH_FILE = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.+-]{0,255})+\.sqsh")
# Paths that reach sbatch/srun options (--output, --chdir, --container-mounts' SRC:DST[:ro],... list): absolute,
# and none of the separators of those lists, Slurm's %-patterns or control characters (a newline in a job
# script could start an #SBATCH line).
PATH_REFUSED = re.compile(r"[,:%\x00-\x1f\x7f]")
# Environment variables that sbatch and srun read as their own options (SBATCH_PARTITION, SRUN_CPUS_PER_TASK ...)
# or that point them at another cluster (SLURM_CONF): an entry's env would bypass the checks of its slurm: keys.
SLURM_OPTION_ENV = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")


def slurm_path_problem(value: Path) -> str | None:
    """Why ``value`` may not be a path of a Slurm entry (shared_dir, project_root), or None."""
    if not value.is_absolute() or ".." in value.parts or PATH_REFUSED.search(str(value)):
        return f"{str(value)!r} must be an absolute path without '..', ',', ':', '%' or control characters"
    return None


def slurm_entry_problem(env: dict[str, str]) -> tuple[str, str] | None:
    """(key, why) for what a Slurm entry's other keys may not hold, or None: the variables sbatch and srun read
    as options. (Its project_root, an item of the container's mounts, is checked for every host by the inventory.)"""
    for name in env:
        if name.startswith(SLURM_OPTION_ENV):
            return f"env.{name}", ("sbatch and srun read this variable as an option of theirs; set it with the "
                                   "entry's slurm: keys")
    return None


class SlurmSpec(StrictModel):
    """Where and how each round of this entry runs as a Slurm job."""

    # no inf or nan: a time limit of .inf would only fail when the job's --time is computed, mid-run
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    partition: str | None = Field(default=None, description="sbatch --partition; the cluster's default if unset")
    account: str | None = Field(default=None, description="sbatch --account")
    qos: str | None = Field(default=None, description="sbatch --qos")
    nodes: int | None = Field(default=None, ge=1, le=4096, description="how many nodes (slots) this entry has; "
                                                                         "len(nodelist) when a nodelist is given")
    nodelist: list[str] = Field(default_factory=list, description="the nodes, one slot each (plain node names)")
    node: str | None = Field(default=None, description="the one node this slot runs on (set from nodelist)")
    group: str | None = Field(default=None, description="the entry a slot came from (set by the inventory): the "
                                                         "nodes of a multi-node round are slots of one entry")
    gres: str | None = Field(default=None, description="sbatch --gres per node, e.g. gpu:8 or gpu:h100:8")
    constraint: str | None = Field(default=None, description="sbatch --constraint (node features)")
    exclusive: bool = Field(default=True, description="sbatch --exclusive: no other job shares a measured node")
    container_image: str | None = Field(default=None, description="run in this image through pyxis/enroot (srun "
                                        "--container-image); unset: the nodes' own python")
    container_mounts: list[str] = Field(default_factory=list, description="more SRC:DST[:ro] mounts for the "
                                        "container (the shared folder and project_root are always mounted)")
    shared_dir: Path = Field(strict=False, description="a folder of yours that the controller and every node see: "
                             "jobs, monitors and results are written there and collected into the run folder")
    pending_timeout_s: float = Field(default=600.0, gt=0, description="a job still pending after this long is "
                                     "cancelled and the round fails naming squeue's reason (time CONFIGURING, its "
                                     "nodes allocated and booting, is not counted: see configuring_timeout_s)")
    configuring_timeout_s: float = Field(default=1800.0, gt=0, description="a job still CONFIGURING (its nodes "
                                         "allocated and booting, e.g. powered up on demand by a power-saving "
                                         "cluster, or running a prolog) this long after squeue first said so is "
                                         "cancelled and the round fails; more than the nodes' boot takes")
    time_slack_s: float = Field(default=300.0, ge=0, description="the job's --time is the case's timeout_s plus "
                                "this (start-up, container, monitors)")
    poll_s: float = Field(default=1.0, ge=0.1, le=60, description="how often the controller looks at the job's "
                          "files on the shared folder")
    state_poll_s: float = Field(default=10.0, ge=0.5, le=600, description="how often it asks squeue whether a "
                                "running job still runs (a job killed under it is noticed within this)")
    command_timeout_s: float = Field(default=60.0, gt=0, description="limit for one sbatch/squeue/scancel call")
    master_port_base: int = Field(default=20000, ge=1024, le=60000, description="a multi-node job's MASTER_PORT "
                                  "is this + SLURM_JOB_ID mod 5000")

    @field_validator("partition", "account", "qos", "node", "group")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm name (letters, digits, '_', '.', '-')")
        return value

    @field_validator("nodelist")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        for node in value:
            if not SLURM_NAME.fullmatch(node):
                raise ValueError(f"{node!r} is not a node name (write each node, not a hostlist expression)")
        if len(set(value)) != len(value):
            raise ValueError("a node is listed twice")
        return value

    @field_validator("gres")
    @classmethod
    def _gres(cls, value: str | None) -> str | None:
        if value is not None and not GRES.fullmatch(value):
            raise ValueError(f"{value!r} is not a gres request (NAME[:TYPE][:COUNT], comma-separated)")
        return value

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None and not CONSTRAINT.fullmatch(value):
            raise ValueError(f"{value!r} is not a node feature expression")
        return value

    @field_validator("container_image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not (IMAGE.fullmatch(value) or SQUASH_FILE.fullmatch(value)):
            raise ValueError(f"{value!r} is not an image name or an absolute .sqsh path")
        return value

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        for mount in value:
            parts = mount.split(":")
            if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]) or "," in mount \
                    or (len(parts) == 3 and parts[2] not in ("ro", "rw")) or re.search(r"[\s\x00-\x1f\x7f]", mount):
                raise ValueError(f"{mount!r}: expected /SRC:/DST[:ro|rw]")
            try:  # the rule of every mount's paths (-v, data mounts): no '..', and no mount over the root
                source = clean_path(parts[0], f"{mount!r}: its host path")
                target = clean_path(parts[1], f"{mount!r}: its container path")
            except PolicyError as exc:
                raise ValueError(str(exc)) from None
            if "/" in (source, target):
                raise ValueError(f"{mount!r}: a mount of or over the file system's root '/' is refused")
        return value

    @field_validator("shared_dir")
    @classmethod
    def _shared(cls, value: Path) -> Path:
        problem = slurm_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _count(self) -> SlurmSpec:
        if self.nodelist and self.nodes is not None and self.nodes != len(self.nodelist):
            raise ValueError(f"nodes is {self.nodes} but nodelist names {len(self.nodelist)}")
        if self.node is not None and (self.nodelist or (self.nodes or 1) != 1):
            raise ValueError("node pins one slot: give node, or nodes/nodelist, not both")
        return self

    def slot_count(self) -> int:
        return len(self.nodelist) or self.nodes or 1


def slurm_slots(spec: Any) -> list[Any]:
    """The hosts an inventory entry stands for: itself, or one per node of a Slurm entry (``<name>-<node>`` for
    a nodelist, ``<name>-<i>`` for a count), each a copy of the entry pinned to its node when there is a list.
    ``spec`` is a HostSpec (not imported here: the inventory imports this module)."""
    slurm: SlurmSpec | None = getattr(spec, "slurm", None)
    if slurm is None:
        return [spec]
    group = slurm.group or spec.name
    count = slurm.slot_count()
    if count == 1:
        node = slurm.nodelist[0] if slurm.nodelist else slurm.node
        return [spec.model_copy(update={"slurm": slurm.model_copy(update={
            "group": group, "node": node, "nodelist": [], "nodes": 1})})]
    slots = []
    for index in range(count):
        node = slurm.nodelist[index] if slurm.nodelist else None
        slots.append(spec.model_copy(update={
            "name": f"{spec.name}-{node or index + 1}",
            "slurm": slurm.model_copy(update={"group": group, "node": node, "nodelist": [], "nodes": 1})}))
    return slots

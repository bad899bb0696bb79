"""Where ``python -m lit_ppo fit`` runs, as the ``scheduler`` section sets it: the settings of a Slurm batch
job or a Ray Train job (``lit_ppo.schedulers`` submits them), checked when the config composes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from lit_ppo.config.checks import check_fields
from lit_ppo.errors import ConfigError

_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
_NAME = re.compile(r"[^\s#'\"\\]+")
_ADDRESS = re.compile(r"[^\s:/]+:\d{1,5}")


@dataclass
class SlurmConfig:
    """The batch job's settings (``scheduler.<field>=value``)."""

    nodes: int = 1
    """Nodes to allocate (``--nodes``); ``trainer.num_nodes`` follows."""
    gpus_per_node: int = 0
    """GPUs per node (``--gpus-per-node``), one task each; 0 for a CPU job: one task per node, DDP over gloo."""
    cpus_per_task: int = 4
    """CPU cores per task (``--cpus-per-task``): for the data, the tokenizer and the rollout engine."""
    time: str = "04:00:00"
    """Time limit (``--time``) in Slurm's formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    partition: str | None = None
    """Partition (``--partition``); None for the cluster's default."""
    account: str | None = None
    """Account charged (``--account``); None for the user's default."""
    job_name: str | None = None
    """Name squeue shows (``--job-name``); None for the run directory's name."""
    extra_sbatch: list[str] = field(default_factory=list)
    """More ``#SBATCH`` lines, each the option as written after ``#SBATCH``, e.g. ``--mem=0``, ``--exclusive``."""
    dry_run: bool = False
    """Write and print the script, submit nothing."""

    def __post_init__(self) -> None:
        if isinstance(self.time, int) and not isinstance(self.time, bool):
            self.time = str(self.time)  # minutes, as Hydra parses a bare number
        check_fields(self, "scheduler")
        for name, least, allowed in (("nodes", 1, "a positive integer"), ("cpus_per_task", 1, "a positive integer"),
                                     ("gpus_per_node", 0, "an integer >= 0 (0 for a CPU job)")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"scheduler.{name}={value!r} is invalid: must be {allowed}")
        if not _TIME.fullmatch(self.time):
            raise ValueError(f"scheduler.time={self.time!r} is invalid: must be a Slurm time limit: minutes, "
                             f"MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
        for name in ("partition", "account", "job_name"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
                raise ValueError(f"scheduler.{name}={value!r} is invalid: must be a name without spaces or "
                                 f"quotes, or null")
        if self.job_name in ("bash", "interactive"):  # Lightning then ignores Slurm and launches ranks itself
            raise ValueError(f"scheduler.job_name={self.job_name} is invalid: Lightning takes a job of that "
                             f"name for an interactive shell, not a batch job")
        if not isinstance(self.extra_sbatch, list):
            raise ValueError(f"scheduler.extra_sbatch={self.extra_sbatch!r} is invalid: must be a list of "
                             f"sbatch options, e.g. ['--mem=0']")
        for line in self.extra_sbatch:
            if not (isinstance(line, str) and line.startswith("-") and "\n" not in line):
                raise ValueError(f"scheduler.extra_sbatch item {line!r} is invalid: must be an sbatch option "
                                 f"such as --mem=0 (what follows #SBATCH)")
        if not isinstance(self.dry_run, bool):
            raise ValueError(f"scheduler.dry_run={self.dry_run!r} is invalid: must be true or false")

    @property
    def tasks_per_node(self) -> int:
        """One task (rank) per GPU; on CPU one per node, whose cores its threads use."""
        return self.gpus_per_node or 1


@dataclass
class RayConfig:
    """The Ray Train job's settings (``scheduler.<field>=value``)."""

    address: str | None = None
    """The Ray cluster to run on, as ``ray.init(address=...)`` takes it: ``host:port`` of its head node's
    GCS (``ray start --head`` prints it) or ``auto`` for the cluster this machine belongs to; null to
    start a local cluster for this job (stopped when the job ends), or join the one ``RAY_ADDRESS``
    names, as ``ray.init()`` does."""
    num_workers: int = 2
    """Training workers, one rank each: the world size."""
    resources_per_worker: dict[str, float] | None = None
    """Ray resources each worker reserves, e.g. ``{CPU: 4, GPU: 1}``; null for Ray's default, one CPU.
    With a GPU the workers train on GPUs (one each, NCCL), else on CPU (gloo)."""

    def __post_init__(self) -> None:
        check_fields(self, "scheduler")
        address = self.address
        if address is not None and not (isinstance(address, str)
                                        and (address == "auto" or _ADDRESS.fullmatch(address))):
            raise ValueError(f"scheduler.address={self.address!r} is invalid: must be host:port, auto "
                             f"or null (a local cluster)")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"scheduler.num_workers={self.num_workers!r} is invalid: must be a positive integer")
        resources = self.resources_per_worker
        if resources is not None and (not isinstance(resources, dict) or not resources):
            raise ValueError(f"scheduler.resources_per_worker={resources!r} is invalid: must be a mapping of "
                             f"Ray resources to amounts, e.g. {{CPU: 1}}")
        for key, amount in (resources or {}).items():
            if (not isinstance(key, str) or isinstance(amount, bool) or not isinstance(amount, (int, float))
                    or not amount >= 0):
                raise ValueError(f"scheduler.resources_per_worker.{key}={amount!r} is invalid: must be a "
                                 f"number >= 0 of a Ray resource (CPU, GPU, memory, a custom one)")
        if self.gpus_per_worker > 1:
            raise ValueError(f"scheduler.resources_per_worker.GPU={self.gpus_per_worker} is invalid: each worker "
                             f"is one rank on one device: at most 1")

    @property
    def gpus_per_worker(self) -> float:
        return (self.resources_per_worker or {}).get("GPU", 0)


SCHEDULERS = {"local": None, "ray": RayConfig, "slurm": SlurmConfig}
"""scheduler=<name> -> the settings of its job (None: this process)."""
JobConfig = SlurmConfig | RayConfig


def scheduler_config(section: Any) -> JobConfig | None:
    """The composed ``scheduler`` section, checked: None to run in this process, else the job's
    settings. ConfigError of one line naming the key."""
    section = dict(section or {"type": "local"})
    kind = section.pop("type", None)
    if kind not in SCHEDULERS:
        raise ConfigError(f"scheduler={kind} is invalid: must be one of {', '.join(SCHEDULERS)}")
    cls = SCHEDULERS[kind]
    names = [f.name for f in fields(cls)] if cls else []
    for name in section:
        if name not in names:
            allowed = ", ".join(names) or "none (give scheduler=slurm or scheduler=ray for a job)"
            raise ConfigError(f"scheduler.{name} is not a key of scheduler={kind}: allowed: {allowed}")
    if cls is None:
        return None
    try:
        return cls(**section)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def scheduler_name(cfg: JobConfig) -> str:
    """The ``scheduler`` option of the job's settings: slurm or ray."""
    return "ray" if isinstance(cfg, RayConfig) else "slurm"



"""Where ``python -m lit_ppo fit`` runs: ``scheduler=local`` (this process, the default),
``scheduler=slurm`` (a Slurm batch job, see lit_ppo.schedulers.slurm) or ``scheduler=ray`` (a Ray
Train job, see lit_ppo.schedulers.ray)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from lit_ppo.errors import ConfigError
from lit_ppo.schedulers import ray, slurm
from lit_ppo.schedulers.ray import RayConfig
from lit_ppo.schedulers.slurm import SlurmConfig

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
    return "ray" if isinstance(cfg, RayConfig) else "slurm"


def check_job_trainer(cfg: JobConfig, trainer: dict) -> None:
    """ConfigError for composed trainer settings that the job cannot run."""
    if isinstance(cfg, RayConfig):
        ray.check_strategy(trainer)


def job_trainer(cfg: JobConfig, trainer: dict) -> dict:
    """The trainer settings the job's ranks run with (over those of ``trainer``)."""
    return (ray if isinstance(cfg, RayConfig) else slurm).job_trainer(cfg, trainer)


def submit(cfg: JobConfig, overrides: list[str], flags: list[str], tree: dict,
           worker_fit: Callable[[dict], None]) -> int:
    """Start the job of the validated fit ``tree``; the exit code. A Ray job's workers each run
    ``worker_fit(job)``; a Slurm job's ranks run ``python -m lit_ppo fit`` with the same arguments."""
    if isinstance(cfg, RayConfig):
        return ray.submit(cfg, overrides, flags, tree, worker_fit)
    return slurm.submit(cfg, overrides, flags, tree)

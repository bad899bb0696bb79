"""Layer 7, where ``python -m lit_ppo fit`` runs: ``scheduler=local`` (this process, the default),
``scheduler=slurm`` (a Slurm batch job, see lit_ppo.schedulers.slurm) or ``scheduler=ray`` (a Ray
Train job, see lit_ppo.schedulers.ray)."""

from __future__ import annotations

from typing import Callable

from lit_ppo.config.scheduler import SCHEDULERS, JobConfig, RayConfig, SlurmConfig, scheduler_config, scheduler_name
from lit_ppo.schedulers import ray, slurm

__all__ = ["SCHEDULERS", "JobConfig", "RayConfig", "SlurmConfig", "check_job_trainer", "job_trainer",
           "scheduler_config", "scheduler_name", "submit"]


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

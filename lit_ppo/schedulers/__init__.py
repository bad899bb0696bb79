"""Where ``python -m lit_ppo fit`` runs: ``scheduler=local`` (this process, the default) or
``scheduler=slurm`` (a Slurm batch job, see lit_ppo.schedulers.slurm)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from lit_ppo.cli_errors import ConfigError
from lit_ppo.schedulers.slurm import SlurmConfig

SCHEDULERS = ("local", "slurm")


def scheduler_config(section: Any) -> SlurmConfig | None:
    """The composed ``scheduler`` section, checked: None to run in this process, else the batch job's
    settings. ConfigError of one line naming the key."""
    section = dict(section or {"type": "local"})
    kind = section.pop("type", None)
    if kind not in SCHEDULERS:
        raise ConfigError(f"scheduler={kind} is invalid: must be one of {', '.join(SCHEDULERS)}")
    names = [f.name for f in fields(SlurmConfig)]
    for name in section:
        if kind == "local" or name not in names:
            allowed = "none (give scheduler=slurm for a batch job)" if kind == "local" else ", ".join(names)
            raise ConfigError(f"scheduler.{name} is not a key of scheduler={kind}: allowed: {allowed}")
    if kind == "local":
        return None
    try:
        return SlurmConfig(**section)
    except ValueError as e:
        raise ConfigError(str(e)) from None

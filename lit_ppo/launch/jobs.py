"""The jobs that train a model on examples of their own in fit's config system (``sft``, ``rm``), their config
made one way for the command line and the Python API: the ``<job>.key=value`` overrides the job's section, every
other override composed as fit's, and the job's LightningCLI tree of them (``sft_tree``, ``rm_tree``). This file
imports nothing heavy, so that composing a job's config loads no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import NamedTuple

import yaml

from lit_ppo.config.checks import type_hints
from lit_ppo.config.rm import RM_ALGO, RMConfig
from lit_ppo.config.sections import construct
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError
from lit_ppo.launch.rm import rm_tree
from lit_ppo.launch.sft import sft_tree


class Job(NamedTuple):
    """A job's own section and how its tree is made of fit's."""

    section: type
    """The dataclass of its ``<job>.*`` keys."""
    tree: Callable[[dict, object, int | None], dict]
    """``tree(fit's composed tree, the section, the trainer.max_steps given or None)``: the job's LightningCLI tree."""


JOBS = {"sft": Job(SFTConfig, sft_tree), RM_ALGO: Job(RMConfig, rm_tree)}
"""Each job by its command's name (``python -m lit_ppo sft``, ``rm``)."""


def section_overrides(overrides: list[str], section: str, section_class: type) -> tuple[object, list[str]]:
    """The ``section_class`` config of the ``<section>.key=value`` overrides (values read as YAML) and the other
    overrides."""
    values, others = {}, []
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == section or key.startswith(f"{section}."):
            if key == section or key.count(".") != 1:
                raise ConfigError(f"{key} is not a key: give {section}.<key>=value, one of "
                                  f"{', '.join(f'{section}.{f.name}' for f in fields(section_class))}")
            name = key.split(".", 1)[1]
            # A text field keeps its text as typed: '{answer}' is a format string, not YAML's mapping.
            text = type_hints(section_class).get(name) in (str, str | None) and value not in ("", "null", "~")
            values[name] = value if text else yaml.safe_load(value) if value else None
        else:
            others.append(override)
    return construct(section_class, values, section), others


def given_max_steps(overrides: list[str]) -> int | None:
    """The ``trainer.max_steps`` that ``overrides`` give (the last one, as Hydra takes it), None where none does:
    then the job's epochs decide."""
    given = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == "trainer.max_steps"]
    return yaml.safe_load(given[-1]) if given else None

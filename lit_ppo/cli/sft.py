"""``python -m lit_ppo sft [group=option ...] [key=value ...]``: supervised fine-tuning in fit's config
system, through fit's door (``lit_ppo.launch.run.sft``). The ``sft.*`` keys are its own; every other
override composes as fit's does, so ``model=``, ``data=``, ``trainer=``, ``logger=`` and
``actor.optimizer.*`` mean what they mean there. Every outcome is one line and an exit code, as fit's:
0 done, 2 bad input, 1 a failure, 128 + the signal."""

from __future__ import annotations

from pathlib import Path

import lit_ppo.config.sft as sft_config
from lit_ppo.cli.job import job_help, job_main
from lit_ppo.config.sft import SFTConfig
from lit_ppo.launch.jobs import section_overrides
from lit_ppo.launch.sft import sft_tree

USAGE = "python -m lit_ppo sft [group=option ...] [key=value ...] [sft.key=value ...] [--ckpt_path CKPT]"


def main(argv: list[str]) -> int:
    """``sft`` with its overrides; ``argv``: the command line after ``python -m lit_ppo``, ``sft`` first."""
    return job_main(argv, SFTConfig, sft_tree, "sft", help_text, USAGE)


def sft_overrides(overrides: list[str]) -> tuple[SFTConfig, list[str]]:
    """The ``SFTConfig`` of the ``sft.key=value`` overrides (values read as YAML) and the other overrides."""
    return section_overrides(overrides, "sft", SFTConfig)


def help_text(overrides: list[str] = ()) -> str:
    """The usage line, what sft takes from fit's config, the model, task and optimizer that the ``overrides``
    compose (the presets' choices, such as the model's learning rate, included), and every ``sft.*`` key with
    its value. ConfigError for overrides that do not compose."""
    return job_help(list(overrides), "sft", SFTConfig, Path(sft_config.__file__), USAGE, [
        "Supervised fine-tuning: the loss is the negative log-likelihood of the completions' tokens.",
        "From fit's config: model=NAME|DIR and model.*, data=<task> and data.task_kwargs.* (a completion",
        "column, chat messages, or sft.completion_template), actor.optimizer.*, trainer=cpu|gpu|ddp,",
        "trainer.max_steps, logger=..., checkpoint.*, seed. The run directory's model/ is what",
        "`fit model=<run dir>/model` starts from."])

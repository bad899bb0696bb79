"""``python -m lit_ppo rm [group=option ...] [key=value ...]``: reward-model training on preference pairs in
fit's config system, through fit's door (``lit_ppo.launch.run.rm``), as ``sft``'s command is. The ``rm.*`` keys
are its own; every other override composes as fit's does, so ``model=``, ``data=``, ``trainer=``, ``logger=`` and
``actor.optimizer.*`` mean what they mean there. Every outcome is one line and an exit code, as fit's: 0 done, 2
bad input, 1 a failure, 128 + the signal."""

from __future__ import annotations

from pathlib import Path

import lit_ppo.config.rm as rm_config
from lit_ppo.cli.job import job_help, job_main
from lit_ppo.config.rm import RMConfig
from lit_ppo.launch.rm import rm_tree

USAGE = "python -m lit_ppo rm [group=option ...] [key=value ...] [rm.key=value ...] [--ckpt_path CKPT]"


def main(argv: list[str]) -> int:
    """``rm`` with its overrides; ``argv``: the command line after ``python -m lit_ppo``, ``rm`` first."""
    return job_main(argv, RMConfig, rm_tree, "rm", help_text, USAGE)


def help_text(overrides: list[str] = ()) -> str:
    """The usage line, what rm takes from fit's config, the model, task and optimizer that the ``overrides``
    compose, and every ``rm.*`` key with its value. ConfigError for overrides that do not compose."""
    return job_help(list(overrides), "rm", RMConfig, Path(rm_config.__file__), USAGE, [
        "Reward-model training (Bradley-Terry, as TRL's RewardTrainer): the loss is",
        "-log sigmoid(r_chosen - r_rejected - margin) over preference pairs, a scalar head over the model's body.",
        "From fit's config: model=NAME|DIR and model.* (model.lora_rank: LoRA), data=dataset and",
        "data.task_kwargs.* (rows of chosen, rejected and a prompt column or a shared prompt; test_path or",
        "test_fraction), or data=<task> with rm.pairs_fn, actor.optimizer.*, trainer=cpu|gpu|ddp,",
        "trainer.max_steps, logger=..., checkpoint.*, seed. The run directory's model/ is what",
        "`fit 'data.task_kwargs.reward_fns=[<run dir>/model]'` takes as a reward."])

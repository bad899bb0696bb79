"""``python -m lit_ppo sft [group=option ...] [key=value ...]``: supervised fine-tuning in fit's config
system, through fit's door (``lit_ppo.launch.run.sft``). The ``sft.*`` keys are its own; every other
override composes as fit's does, so ``model=``, ``data=``, ``trainer=``, ``logger=`` and
``actor.optimizer.*`` mean what they mean there. Every outcome is one line and an exit code, as fit's:
0 done, 2 bad input, 1 a failure, 128 + the signal."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

import lit_ppo.config.algo as algo_config
import lit_ppo.config.sft as sft_config
from lit_ppo.cli.args import asks_for_help, print_error
from lit_ppo.cli.help import composed
from lit_ppo.cli.reporting import launched, reported
from lit_ppo.config.algo import OptimizerConfig
from lit_ppo.config.checks import type_hints
from lit_ppo.config.model import ModelConfig
from lit_ppo.config.sections import construct
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError
from lit_ppo.launch.compose import compose_run
from lit_ppo.launch.sft import sft_tree
from lit_ppo.utils.flags import flag_value, split_arguments
from lit_ppo.utils.source_docs import dataclass_fields, summary

USAGE = "python -m lit_ppo sft [group=option ...] [key=value ...] [sft.key=value ...] [--ckpt_path CKPT]"


def main(argv: list[str]) -> int:
    """``sft`` with its overrides; ``argv``: the command line after ``python -m lit_ppo``, ``sft`` first."""
    try:
        overrides, flags = split_arguments(argv[1:])
        if asks_for_help(argv[1:]):
            print(help_text(overrides))
            return 0
        ckpt_path = flag_value(flags, "--ckpt_path")
        unknown = [f for f in flags if f != ckpt_path and f.split("=", 1)[0] != "--ckpt_path"]
        if unknown:
            raise ConfigError(f"sft takes key=value overrides and --ckpt_path, not {unknown[0]}: usage: {USAGE}")
        sft, others = sft_overrides(overrides)
        given = [o.split("=", 1)[1] for o in others if o.lstrip("+").split("=", 1)[0] == "trainer.max_steps"]
        max_steps = yaml.safe_load(given[-1]) if given else None  # the last one, as Hydra takes it
        tree, scheduler = compose_run(others)
        if scheduler is not None:
            raise ConfigError("sft runs in this process: the scheduler group (scheduler=slurm, scheduler=ray) is fit's")
    except ConfigError as e:
        print_error(str(e))
        return 2
    tree = sft_tree(tree, sft, max_steps)

    def fine_tune() -> None:
        from lit_ppo.launch.run import sft as fine_tuned  # torch, Lightning and the models: once the config composes

        fine_tuned(tree, ckpt_path, overrides=overrides)

    return reported("sft", lambda: launched(argv, fine_tune))


def sft_overrides(overrides: list[str]) -> tuple[SFTConfig, list[str]]:
    """The ``SFTConfig`` of the ``sft.key=value`` overrides (values read as YAML) and the other overrides."""
    values, others = {}, []
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == "sft" or key.startswith("sft."):
            if key == "sft" or key.count(".") != 1:
                raise ConfigError(f"{key} is not a key: give sft.<key>=value, one of "
                                  f"{', '.join(f'sft.{f.name}' for f in fields(SFTConfig))}")
            name = key.split(".", 1)[1]
            # A text field keeps its text as typed: '{answer}' is a format string, not YAML's mapping.
            text = type_hints(SFTConfig).get(name) in (str, str | None) and value not in ("", "null", "~")
            values[name] = value if text else yaml.safe_load(value) if value else None
        else:
            others.append(override)
    return construct(SFTConfig, values, "sft"), others


def help_text(overrides: list[str] = ()) -> str:
    """The usage line, what sft takes from fit's config, the model, task and optimizer that the ``overrides``
    compose (the presets' choices, such as the model's learning rate, included), and every ``sft.*`` key with
    its value. ConfigError for overrides that do not compose."""
    sft, others = sft_overrides(list(overrides))
    tree, _ = composed(others)  # as fit's help composes it: a required value (???) shown, not refused
    optimizer = construct(OptimizerConfig, (tree.get("actor") or {}).get("optimizer") or {}, "actor.optimizer")
    lines = [f"usage: {USAGE}", "",
             "Supervised fine-tuning: the loss is the negative log-likelihood of the completions' tokens.",
             "From fit's config: model=NAME|DIR and model.*, data=<task> and data.task_kwargs.* (a completion",
             "column, chat messages, or sft.completion_template), actor.optimizer.*, trainer=cpu|gpu|ddp,",
             "trainer.max_steps, logger=..., checkpoint.*, seed. The run directory's model/ is what",
             "`fit model=<run dir>/model` starts from.", "",
             "what it trains, and how (fit's presets and the overrides given):",
             f"  model.source={(tree.get('model') or {}).get('source', ModelConfig.source)}",
             f"  data.task={(tree.get('data') or {}).get('task')}"]
    for doc in dataclass_fields(Path(algo_config.__file__), "OptimizerConfig"):
        lines.append(f"  actor.optimizer.{doc.name}={getattr(optimizer, doc.name)!r}  {summary(doc.doc)}")
    lines += ["", "sft keys:"]
    for doc in dataclass_fields(Path(sft_config.__file__), "SFTConfig"):
        lines.append(f"  sft.{doc.name}={getattr(sft, doc.name)!r}  {summary(doc.doc)}")
    return "\n".join(lines)

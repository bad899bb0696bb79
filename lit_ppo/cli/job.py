"""The command line of a job that trains on examples of its own in fit's config system (``sft``, ``rm``): its
``<job>.*`` overrides as its section's config, every other override composed as fit's, ``--ckpt_path`` and
``--help``; every outcome one line and an exit code, as fit's: 0 done, 2 bad input, 1 a failure, 128 + the
signal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lit_ppo.config.algo as algo_config
from lit_ppo.cli.args import asks_for_help, print_error
from lit_ppo.cli.reporting import launched, reported
from lit_ppo.config.algo import OptimizerConfig
from lit_ppo.config.model import ModelConfig
from lit_ppo.config.sections import construct
from lit_ppo.errors import ConfigError
from lit_ppo.launch.compose import compose_run
from lit_ppo.launch.jobs import given_max_steps, section_overrides
from lit_ppo.utils.flags import flag_value, split_arguments
from lit_ppo.utils.source_docs import dataclass_fields, summary


def job_main(argv: list[str], section_class: type, tree: Callable, verb: str,
             help_text: Callable[[list[str]], str], usage: str) -> int:
    """Run the job ``argv[0]`` (``argv``: the command line after ``python -m lit_ppo``): its section's
    ``section_class`` from the ``<job>.*`` overrides, fit's tree composed of the others and made the job's by
    ``tree(composed, section, max_steps)``, then ``lit_ppo.launch.run``'s ``verb`` (imported once the config
    composes); ``--help`` prints ``help_text(overrides)``; ``usage`` ends a refused flag's line."""
    job = argv[0]
    try:
        overrides, flags = split_arguments(argv[1:])
        if asks_for_help(argv[1:]):
            print(help_text(overrides))
            return 0
        ckpt_path = flag_value(flags, "--ckpt_path")
        unknown = [f for f in flags if f != ckpt_path and f.split("=", 1)[0] != "--ckpt_path"]
        if unknown:
            raise ConfigError(f"{job} takes key=value overrides and --ckpt_path, not {unknown[0]}: usage: {usage}")
        section, others = section_overrides(overrides, job, section_class)
        max_steps = given_max_steps(others)
        composed, scheduler = compose_run(others)
        if scheduler is not None:
            raise ConfigError(f"{job} runs in this process: the scheduler group (scheduler=slurm, scheduler=ray) is "
                              f"fit's")
    except ConfigError as e:
        print_error(str(e))
        return 2
    job_tree = tree(composed, section, max_steps)

    def train() -> None:
        from lit_ppo.launch import run  # torch, Lightning and the models: once the config composes

        getattr(run, verb)(job_tree, ckpt_path, overrides=overrides)

    return reported(job, lambda: launched(argv, train))


def job_help(overrides: list[str], section: str, section_class: type, section_file: Path, usage: str,
             about: list[str]) -> str:
    """A job's ``--help``: its ``usage`` line, the lines ``about`` it, the model, task and optimizer that the
    ``overrides`` compose (the presets' choices, such as the model's learning rate, included), and every
    ``<section>.*`` key (the fields of ``section_class``, documented in ``section_file``) with its value.
    ConfigError for overrides that do not compose."""
    from lit_ppo.cli.help import composed

    values, others = section_overrides(overrides, section, section_class)
    tree, _ = composed(others)  # as fit's help composes it: a required value (???) shown, not refused
    optimizer = construct(OptimizerConfig, (tree.get("actor") or {}).get("optimizer") or {}, "actor.optimizer")
    lines = [f"usage: {usage}", "", *about, "",
             "what it trains, and how (fit's presets and the overrides given):",
             f"  model.source={(tree.get('model') or {}).get('source', ModelConfig.source)}",
             f"  data.task={(tree.get('data') or {}).get('task')}"]
    for doc in dataclass_fields(Path(algo_config.__file__), "OptimizerConfig"):
        lines.append(f"  actor.optimizer.{doc.name}={getattr(optimizer, doc.name)!r}  {summary(doc.doc)}")
    lines += ["", f"{section} keys:"]
    for doc in dataclass_fields(section_file, section_class.__name__):
        lines.append(f"  {section}.{doc.name}={getattr(values, doc.name)!r}  {summary(doc.doc)}")
    return "\n".join(lines)

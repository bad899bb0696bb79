"""``python -m lit_ppo fit|validate|test``: Hydra overrides are composed and their config sections
checked before torch, Lightning or a model loads, so that a mistake in them is one line within a
second; ``lit_ppo.cli.launch`` then checks the rest and runs or submits the config."""

from __future__ import annotations

from lit_ppo.cli import EVALUATING
from lit_ppo.cli.args import print_error
from lit_ppo.cli.compose import compose_run
from lit_ppo.config.scheduler import JobConfig
from lit_ppo.config.sections import check_sections
from lit_ppo.errors import ConfigError
from lit_ppo.utils.flags import flag_value, split_arguments


def main(argv: list[str]) -> int:
    """``fit``, ``validate`` or ``test`` with Hydra overrides and/or LightningCLI flags; ``argv``: the
    command line after ``python -m lit_ppo``, the subcommand first. Returns the exit code: 0 when it did
    its whole job, 2 for bad input, 1 for a failure, 128 + the signal number when a signal stopped it."""
    try:
        composed = _compose(argv[0], *split_arguments(argv[1:]))
    except ConfigError as e:
        print_error(str(e))
        return 2
    from lit_ppo.cli import launch  # torch, Lightning and the models: only once the overrides compose

    return launch.main(argv, composed)


def _compose(subcommand: str, overrides: list[str], flags: list[str]) -> tuple[dict, JobConfig | None] | None:
    """``compose_run`` of the overrides, its sections checked; None where launch reads the config itself:
    a ``--config`` file, or the config recorded in the checkpoint that ``validate|test`` scores."""
    if flag_value(flags, "--config") is not None or (subcommand in EVALUATING and flag_value(flags, "--ckpt_path")):
        return None
    composed = compose_run(overrides)
    check_sections(composed[0])
    return composed

"""``python -m lit_ppo fit|validate|test``: Hydra overrides are composed and their config sections
checked before torch, Lightning or a model loads, so that a mistake in them is one line within a
second; then the command's config, from its input, is checked and run here (``lit_ppo.launch.run``)
or submitted as a scheduler's job. Every outcome is one line and an exit code.

The input is one of: Hydra ``group=option`` / ``key=value`` overrides of ``conf/``
(``lit_ppo.launch.compose``), which may choose a scheduler; a ``--config run.yaml`` file (LightningCLI's
own YAML); the config recorded in the checkpoint of ``validate|test --ckpt_path CKPT [key=value ...]``.
Every input runs through the same LitPPOCLI, so it validates, instantiates and saves identically and
``--print_config`` output replays exactly."""

from __future__ import annotations

from lit_ppo.cli.args import print_error
from lit_ppo.cli.reporting import launched, reported
from lit_ppo.config.scheduler import JobConfig
from lit_ppo.config.sections import check_sections
from lit_ppo.errors import ConfigError
from lit_ppo.launch.compose import compose_run
from lit_ppo.launch.presets import EVALUATING
from lit_ppo.utils.flags import flag_value, split_arguments

HELP_ALL = "--help-all"
"""Asks for LightningCLI's own help (``--help`` shows lit_ppo's keys: lit_ppo.cli.help)."""


def main(argv: list[str]) -> int:
    """``fit``, ``validate`` or ``test`` with Hydra overrides and/or LightningCLI flags; ``argv``: the
    command line after ``python -m lit_ppo``, the subcommand first. Returns the exit code: 0 when it did
    its whole job, 2 for bad input, 1 for a failure, 128 + the signal number when a signal stopped it."""
    try:
        composed = _compose(argv[0], *split_arguments(argv[1:]))
    except ConfigError as e:
        print_error(str(e))
        return 2
    return _run_reporting(argv, composed)


def _compose(subcommand: str, overrides: list[str], flags: list[str]) -> tuple[dict, JobConfig | None] | None:
    """``compose_run`` of the overrides, its sections checked; None where the config is read later: a
    ``--config`` file, or the config recorded in the checkpoint that ``validate|test`` scores."""
    if flag_value(flags, "--config") is not None or (subcommand in EVALUATING and flag_value(flags, "--ckpt_path")):
        return None
    composed = compose_run(overrides)
    check_sections(composed[0])
    return composed


def _run_reporting(argv: list[str], composed: tuple[dict, JobConfig | None] | None) -> int:
    """``_run`` with every way it ends as one line and an exit code (``lit_ppo.cli.reporting``)."""
    argv = ["--help" if arg == HELP_ALL else arg for arg in argv]  # LightningCLI's help: every Lightning flag
    return reported(argv[0], lambda: _run(argv, composed))


def _run(argv: list[str], composed: tuple[dict, JobConfig | None] | None) -> int:
    """The config of the command ``argv`` from its input, checked, then run here or submitted; the exit code."""
    from lit_ppo.config.keys import LIGHTNING_SECTIONS
    from lit_ppo.launch import run as launch
    from lit_ppo.launch.explain import read_config_file

    subcommand = argv[0]
    overrides, flags = split_arguments(argv[1:])
    config_file = flag_value(flags, "--config")
    if config_file is not None:
        if overrides:
            raise ConfigError("give either Hydra overrides (key=value) or --config run.yaml, not both")
        loaded = read_config_file(config_file)
        ckpt_path = ckpt_path_arg(flags, loaded)
        resumed = launch.resume_fit(ckpt_path, loaded) if subcommand == "fit" else None
        if resumed is None:  # LitPPOCLI reads the file and the flags as given
            launch.check({k: v for k, v in loaded.items() if k in LIGHTNING_SECTIONS}, subcommand, ckpt_path)

            def replay() -> None:
                launch.run(subcommand, None, flags=flags)
                launch.fail_if_pending()

            return launched(argv, replay)
        tree, ckpt_path = resumed
        flags = _without_flag(_without_flag(flags, "--ckpt_path"), "--config")
        return launched(argv, lambda: launch.fit(tree, ckpt_path, flags=flags, resumed=True))
    ckpt_path = ckpt_path_arg(flags)
    local_flags = _without_flag(flags, "--ckpt_path")
    tree = launch.evaluation_tree(subcommand, ckpt_path, overrides) if subcommand in EVALUATING and ckpt_path else None
    if tree is not None:
        return launched(argv, lambda: launch.evaluate(subcommand, tree, ckpt_path, recorded=True, flags=local_flags))
    tree, scheduler = composed or compose_run(overrides)
    if scheduler is None:
        if subcommand == "fit":
            return launched(argv, lambda: launch.fit(tree, ckpt_path, overrides=overrides, flags=local_flags))
        return launched(argv, lambda: launch.evaluate(subcommand, tree, ckpt_path, flags=local_flags))
    from lit_ppo import schedulers  # loads Lightning (the run records): only a job submitted needs it

    schedulers.check_job_trainer(scheduler, tree["trainer"])
    launch.check(tree, subcommand, ckpt_path)
    if subcommand != "fit":
        raise ConfigError(f"scheduler={schedulers.scheduler_name(scheduler)} submits fit only: "
                          f"run {subcommand} here (scheduler=local)")
    launch.note_real_model(tree)
    if not any(flag.split("=", 1)[0] == "--print_config" for flag in flags):
        return schedulers.submit(scheduler, overrides, flags, tree, _fit_on_ray_worker)
    tree["trainer"].update(schedulers.job_trainer(scheduler, tree["trainer"]))  # the job's config, printed
    return launched(argv, lambda: launch.run(subcommand, tree, ckpt_path, flags=local_flags))


def _fit_on_ray_worker(job: dict) -> None:
    """A ``scheduler=ray`` worker's rank of the fit (``lit_ppo.launch.ray_worker``, which imports Ray: only
    Ray's workers load it)."""
    from lit_ppo.launch.ray_worker import fit_on_worker

    fit_on_worker(job)


def ckpt_path_arg(flags: list[str], config: dict | None = None) -> str | None:
    """The ``--ckpt_path`` of LightningCLI flags (``--ckpt_path X`` or ``--ckpt_path=X``; the last
    one wins, as in the parser), else the config's ``ckpt_path``; None when neither is given."""
    given = flag_value(flags, "--ckpt_path")
    value = given if given is not None else (config or {}).get("ckpt_path")
    return None if value in (None, "", "null", "None") else str(value)


def _without_flag(flags: list[str], name: str) -> list[str]:
    """``flags`` without ``--name X`` / ``--name=X``."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == name:
            skip = True
        elif not flag.startswith(name + "="):
            out.append(flag)
    return out

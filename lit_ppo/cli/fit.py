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

import os
import sys
import traceback
from pathlib import Path

from lit_ppo.cli.args import print_error
from lit_ppo.config.scheduler import JobConfig
from lit_ppo.config.sections import check_sections
from lit_ppo.errors import ConfigError, RunStopped
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
    """``_run`` with every way it ends as one line and an exit code."""
    # torch, Lightning and the models: only once the overrides compose
    from lit_ppo.launch.explain import explain_parser_error
    from lit_ppo.launch.lightning_cli import quiet_expected_output
    from lit_ppo.run.tracking import RUN_DIR_ENV, end_started_runs
    from lit_ppo.utils.stop_requests import Stopped, exit_code, signal_name

    quiet_expected_output()
    argv = ["--help" if arg == HELP_ALL else arg for arg in argv]  # LightningCLI's help: every Lightning flag
    subcommand = argv[0]
    try:
        return _run(argv, composed)
    except ConfigError as e:
        print_error(str(e))
        return 2
    except Stopped as e:
        end_started_runs("KILLED")
        where = getattr(e, "where", None) or ("during " + subcommand if subcommand in EVALUATING else
                                             "before the first iteration")
        what = (": no scores" if subcommand in EVALUATING else
                ": nothing was trained" if where == "before the first iteration" else "")
        print_error(f"stopped by {signal_name(e.signum)} {where}{what}")
        return exit_code(e.signum)
    except RunStopped as e:
        if not str(e):  # another process of the run has said why
            return 1
        log = _keep_traceback(e, os.environ.get(RUN_DIR_ENV))
        print_error(f"{e}" + (f" (traceback in {log})" if log else ""))
        return 1
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError"):
            print_error(explain_parser_error(e))
            return 2
        # Anything else failed the run: one line, the traceback kept in the run directory (or, without
        # one, shown, since it is all there is to go on).
        log = _keep_traceback(e, os.environ.get(RUN_DIR_ENV))
        if log is None:
            traceback.print_exception(e)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print_error(f"{type(e).__name__}: {reason}" + (f" (traceback in {log})" if log else ""))
        return 1


def _run(argv: list[str], composed: tuple[dict, JobConfig | None] | None) -> int:
    """The config of the command ``argv`` from its input, checked, then run here or submitted; the exit code."""
    from lit_ppo import schedulers
    from lit_ppo.config.keys import LIGHTNING_SECTIONS
    from lit_ppo.launch.compose import real_model_note
    from lit_ppo.launch.explain import read_config_file
    from lit_ppo.launch.run import check, evaluation_tree, resume_fit
    from lit_ppo.run.tracking import launched_as_rank_zero

    subcommand = argv[0]
    overrides, flags = split_arguments(argv[1:])
    config_file = flag_value(flags, "--config")
    if config_file is not None:
        if overrides:
            raise ConfigError("give either Hydra overrides (key=value) or --config run.yaml, not both")
        loaded = read_config_file(config_file)
        ckpt_path = ckpt_path_arg(flags, loaded)
        resumed = resume_fit(ckpt_path, loaded) if subcommand == "fit" else None
        if resumed is None:  # LitPPOCLI reads the file and the flags as given
            check({k: v for k, v in loaded.items() if k in LIGHTNING_SECTIONS}, subcommand, ckpt_path)
            return _launch(argv, subcommand, None, None, flags)
        tree, ckpt_path = resumed
        check(tree, subcommand, ckpt_path)
        return _launch(argv, subcommand, tree, ckpt_path, _without_flag(_without_flag(flags, "--ckpt_path"), "--config"))
    ckpt_path = ckpt_path_arg(flags)
    local_flags = _without_flag(flags, "--ckpt_path")
    tree = evaluation_tree(subcommand, ckpt_path, overrides) if subcommand in EVALUATING and ckpt_path else None
    if tree is not None:
        # No resume check: a config read from the checkpoint (which evaluation_tree verified) matches it.
        check(tree, subcommand)
        return _launch(argv, subcommand, tree, ckpt_path, local_flags)
    tree, scheduler = composed or compose_run(overrides)
    resumed = resume_fit(ckpt_path, tree, overrides) if subcommand == "fit" and scheduler is None else None
    if resumed is not None:
        tree, ckpt_path = resumed
    if scheduler is not None:
        schedulers.check_job_trainer(scheduler, tree["trainer"])
    check(tree, subcommand, ckpt_path)
    if scheduler is not None and subcommand != "fit":
        raise ConfigError(f"scheduler={schedulers.scheduler_name(scheduler)} submits fit only: "
                          f"run {subcommand} here (scheduler=local)")
    note = real_model_note(tree) if subcommand == "fit" and launched_as_rank_zero() else None
    if note is not None:  # the config passed every check: the settings it trains with are final
        print(note, file=sys.stderr, flush=True)
    if scheduler is not None:
        if not any(flag.split("=", 1)[0] == "--print_config" for flag in flags):
            return schedulers.submit(scheduler, overrides, flags, tree, _fit_on_ray_worker)
        tree["trainer"].update(schedulers.job_trainer(scheduler, tree["trainer"]))  # the job's config
    return _launch(argv, subcommand, tree, ckpt_path, local_flags)


def _launch(argv: list[str], subcommand: str, tree: dict | None, ckpt_path: str | None, flags: list[str]) -> int:
    """``lit_ppo.launch.run.run`` as the command ``argv``; the exit code."""
    from lit_ppo.launch.run import run
    from lit_ppo.utils.stop_requests import exit_code, pending_failure, received_signal

    # A DDP launcher starts the other ranks by re-running sys.argv: make it this very command.
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        run(subcommand, tree, ckpt_path, flags=flags)
    except SystemExit:  # Lightning exits after a stop signal that abandoned an iteration
        if received_signal() is None:
            raise  # the parser's own exit (--print_config, --help)
    finally:
        sys.argv = saved_argv
    failure = pending_failure()
    if failure is not None:
        print_error(failure)
        return 1
    signum = received_signal()
    return 0 if signum is None else exit_code(signum)


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


def _keep_traceback(error: BaseException, run_dir: str | None) -> Path | None:
    """Append the traceback of a stopped run to its run directory's ``error.log``; that file."""
    if run_dir and Path(run_dir).is_dir():
        try:
            with open(Path(run_dir) / "error.log", "a", encoding="utf-8") as log:
                log.write("".join(traceback.format_exception(error)))
        except OSError:  # the disk that failed the run may refuse the log too: the traceback goes to stderr
            return None
        return Path(run_dir) / "error.log"
    return None

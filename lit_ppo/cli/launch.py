"""``python -m lit_ppo fit|validate|test`` once ``lit_ppo.cli.fit`` has composed its overrides: one checked
config from the command's input, run by LitPPOCLI here or submitted as a scheduler's job; every outcome
one line and an exit code.

The input is one of: a ``--config run.yaml`` file (LightningCLI's own YAML), the config recorded in the
checkpoint of ``validate|test --ckpt_path CKPT [key=value ...]``, or Hydra ``group=option`` /
``key=value`` overrides of ``conf/`` (lit_ppo.cli.compose), which may choose a scheduler. Each is checked
(lit_ppo.cli.check) before anything is instantiated; a config that is not a file already is written to
one and handed to the same LitPPOCLI that ``--config`` uses, so every input validates, instantiates and
saves identically and ``--print_config`` output replays exactly.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import yaml

from lit_ppo import schedulers
from lit_ppo.cli import EVALUATING
from lit_ppo.cli.args import print_error
from lit_ppo.cli.check import check_config
from lit_ppo.cli.compose import compose_run, real_model_note
from lit_ppo.cli.presets import is_group, typed_overrides
from lit_ppo.cli.explain import explain_parser_error, read_config_file
from lit_ppo.cli.lightning_cli import LitPPOCLI, quiet_expected_output, write_config
from lit_ppo.config.keys import LIGHTNING_SECTIONS, lightning_path, set_key
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.run.resume import check_resume_args, ckpt_path_arg, config_changes, recorded_config, resumed_config
from lit_ppo.run.tracking import (RUN_DIR_ENV, end_started_runs, forget_continued_runs, last_checkpoint,
                                  launched_as_rank_zero)
from lit_ppo.utils.flags import flag_value, split_arguments
from lit_ppo.utils.stop_requests import Stopped, exit_code, pending_failure, received_signal, signal_name

HELP_ALL = "--help-all"
"""Asks for LightningCLI's own help (``--help`` shows lit_ppo's keys: lit_ppo.cli.help)."""
TRAINED_SECTIONS = ("algo", "model", "actor", "critic", "rejection")
"""What the model in a checkpoint was trained as: LightningCLI restores it from the checkpoint."""


def main(argv: list[str], composed: tuple[dict, schedulers.JobConfig | None] | None = None) -> int:
    """``fit``, ``validate`` or ``test`` with Hydra overrides and/or LightningCLI flags; ``argv``: the
    command line after ``python -m lit_ppo``, the subcommand first; ``composed``: ``compose_run`` of its
    overrides where ``lit_ppo.cli.fit`` composed them already. Returns the exit code: 0 when it did
    its whole job, 2 for bad input, 1 for a failure, 128 + the signal number when a signal stopped it."""
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
        log = _keep_traceback(e)
        print_error(f"{e}" + (f" (traceback in {log})" if log else ""))
        return 1
    except Exception as e:  # jsonargparse parse errors arrive as ArgumentError / ValueError
        if type(e).__name__ in ("ArgumentError", "NSKeyError"):
            print_error(explain_parser_error(e))
            return 2
        # Anything else failed the run: one line, the traceback kept in the run directory (or, without
        # one, shown, since it is all there is to go on).
        log = _keep_traceback(e)
        if log is None:
            traceback.print_exception(e)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print_error(f"{type(e).__name__}: {reason}" + (f" (traceback in {log})" if log else ""))
        return 1


def _run(argv: list[str], composed: tuple[dict, schedulers.JobConfig | None] | None) -> int:
    """The config of the command ``argv`` from its input, checked, then run here or submitted; the exit code."""
    subcommand = argv[0]
    overrides, flags = split_arguments(argv[1:])
    config_file = flag_value(flags, "--config")
    if config_file is not None:
        loaded = _check_config_file(subcommand, config_file, overrides, flags)
        resumed = resume_fit(flags, loaded) if subcommand == "fit" else None
        if resumed is None:
            check_resume_args(flags, loaded, error=ConfigError)
            return _launch(argv, [subcommand, *flags])
        tree, flags = resumed
        check_config(tree, subcommand)
        check_resume_args(flags, tree, error=ConfigError)
        return _launch(argv, [subcommand, "--config", write_config(tree), *_without_flag(flags, "--config")])
    tree = _checkpoint_config(subcommand, overrides, flags)
    if tree is None:
        tree, scheduler = composed or compose_run(overrides)
        resumed = resume_fit(flags, tree, overrides) if subcommand == "fit" and scheduler is None else None
        if resumed is not None:
            tree, flags = resumed
        tree, scheduler = _composed_config(subcommand, (tree, scheduler), flags)
        note = real_model_note(tree) if subcommand == "fit" and launched_as_rank_zero() else None
        if note is not None:  # the config passed every check: the settings it trains with are final
            print(note, file=sys.stderr, flush=True)
        if scheduler is not None:
            if not any(flag.split("=", 1)[0] == "--print_config" for flag in flags):
                return schedulers.submit(scheduler, overrides, flags, tree, _fit_on_ray_worker)
            tree["trainer"].update(schedulers.job_trainer(scheduler, tree["trainer"]))  # the job's config
    return _launch(argv, [subcommand, "--config", write_config(tree), *flags])


def _check_config_file(subcommand: str, path: str, overrides: list[str], flags: list[str]) -> dict:
    """``--config run.yaml``: the file checked as ``subcommand`` will run it (LitPPOCLI reads it itself); its
    content."""
    if overrides:
        raise ConfigError("give either Hydra overrides (key=value) or --config run.yaml, not both")
    loaded = read_config_file(path)
    check_config({k: v for k, v in loaded.items() if k in LIGHTNING_SECTIONS}, subcommand)
    return loaded


GROUP_KEYS = {"algo": "model.algo", "model": "model.model.source", "data": "data.task"}
"""Preset group -> the key of LightningCLI's tree that names what its option chose, which a resume compares
with the run's even where the option is the presets' default."""


def resume_fit(flags: list[str], given: dict, overrides: list[str] | None = None) -> tuple[dict, list[str]] | None:
    """``fit --ckpt_path CKPT``: the run's config recorded in the checkpoint with what this command gives set
    on top (``resumed_config``: each change named, those the checkpoint cannot follow refused), and ``flags``
    with ``--ckpt_path last`` resolved (``last_checkpoint``); None without ``--ckpt_path`` or for a
    checkpoint that records no config. ``given``: a whole config (a ``--config`` file's, the Python API's),
    or, with ``overrides``, the tree they composed, of which only what they set counts."""
    ckpt_path = ckpt_path_arg(flags, given)
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(given))
    flags = [*_without_flag(flags, "--ckpt_path"), "--ckpt_path", ckpt_path]
    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if text is None:
        return None
    recorded = {k: v for k, v in yaml.safe_load(text).items() if k in LIGHTNING_SECTIONS}
    forget_continued_runs(recorded)
    given = {k: v for k, v in given.items() if k in LIGHTNING_SECTIONS}
    if overrides is not None:
        given = _overridden(given, overrides)
    tree, notes = resumed_config(ckpt_path, recorded, given)
    if launched_as_rank_zero():  # the ranks a launcher starts run this command again
        for note in notes:
            print(note, file=sys.stderr, flush=True)
    return tree, flags


def _overridden(tree: dict, overrides: list[str]) -> dict:
    """The part of the composed ``tree`` that ``overrides`` set: the keys they name, the keys whose value
    differs from the presets' and the key each chosen group names (``GROUP_KEYS``); a list as a whole."""
    keys = [GROUP_KEYS[o.lstrip("+~").split("=", 1)[0]] for o in overrides
            if is_group(o) and o.lstrip("+~").split("=", 1)[0] in GROUP_KEYS]
    for override in typed_overrides(overrides):
        path = None if is_group(override) else lightning_path(override.lstrip("+~").split("=", 1)[0])
        if path is not None:
            keys.append(".".join(path))
    keys += [key for key, _, _ in config_changes(compose_run([])[0], tree)]
    out: dict = {}
    for key in keys:
        node, target, parts = tree, out, key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                break
            if i == len(parts) - 1 or not isinstance(node[part], dict):
                target[part] = node[part]
                break
            node, target = node[part], target.setdefault(part, {})
    return out


def _checkpoint_config(subcommand: str, overrides: list[str], flags: list[str]) -> dict | None:
    """``validate|test --ckpt_path CKPT``: the config recorded in the checkpoint with ``overrides`` on top,
    checked; None for another command or a checkpoint that records no config (then the overrides are
    composed as fit's)."""
    ckpt_path = flag_value(flags, "--ckpt_path") if subcommand in EVALUATING else None
    tree = evaluation_tree(subcommand, ckpt_path, overrides) if ckpt_path else None
    if tree is not None:
        # No resume check: a config read from the checkpoint (which evaluation_tree verified) matches it.
        check_config(tree, subcommand)
    return tree


def _composed_config(subcommand: str, composed: tuple[dict, schedulers.JobConfig | None],
                     flags: list[str]) -> tuple[dict, schedulers.JobConfig | None]:
    """The composed config (``compose_run``'s) checked; the scheduler's job to submit (None: run here)."""
    tree, scheduler = composed
    if scheduler is not None:
        schedulers.check_job_trainer(scheduler, tree["trainer"])
    check_config(tree, subcommand)
    check_resume_args(flags, tree, error=ConfigError)
    if scheduler is not None and subcommand != "fit":
        raise ConfigError(f"scheduler={schedulers.scheduler_name(scheduler)} submits fit only: "
                          f"run {subcommand} here (scheduler=local)")
    return tree, scheduler


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


def _launch(argv: list[str], args: list[str]) -> int:
    """Run ``LitPPOCLI(args)`` (LightningCLI's arguments) as the command ``argv``; the exit code."""
    # A DDP launcher starts the other ranks by re-running sys.argv: make it this very command.
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *argv]
    try:
        LitPPOCLI(args)
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
    """A ``scheduler=ray`` worker's rank of the fit (``lit_ppo.cli.ray_worker``, which imports Ray: only
    Ray's workers load it)."""
    from lit_ppo.cli.ray_worker import fit_on_worker

    fit_on_worker(job)


def evaluation_tree(subcommand: str, ckpt_path: str, overrides: list[str]) -> dict | None:
    """The config of ``validate`` / ``test --ckpt_path``: the run's own, recorded in the checkpoint,
    with ``key=value`` overrides on top (e.g. ``eval.k=16``); None for a checkpoint that records none
    (then the overrides are fit's, composed from the presets). ConfigError for an override of the
    model's settings, which the checkpoint's replace."""
    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    typed, overrides = overrides, typed_overrides(overrides)
    _check_evaluation_overrides(subcommand, overrides, typed)
    if text is None:
        return None
    groups = [o for o in overrides if is_group(o)]
    if groups:
        raise ConfigError(f"{subcommand} --ckpt_path uses the checkpoint's own config: {groups[0]} cannot change it "
                          f"(give key=value overrides, or every fit override with --config run.yaml)")
    tree = {k: v for k, v in yaml.safe_load(text).items() if k in LIGHTNING_SECTIONS}
    for override in overrides:
        key, _, value = override.partition("=")
        set_key(tree, key, yaml.safe_load(value) if value else None)
    return tree


def _check_evaluation_overrides(subcommand: str, overrides: list[str], typed: list[str]) -> None:
    """ConfigError for an override that ``validate`` / ``test --ckpt_path`` would ignore: the model's
    settings (LightningCLI takes the checkpoint's) and the logger's (nothing is recorded). ``typed``:
    ``overrides`` as given, ``overrides`` under Hydra's names."""
    for original, override in zip(typed, overrides):
        key = override.lstrip("+~").split("=", 1)[0]
        shown = original.lstrip("+~")
        if key.split(".")[0] in TRAINED_SECTIONS:
            raise ConfigError(f"{shown} cannot be given to {subcommand} --ckpt_path: it scores the checkpoint's "
                              f"model as trained (algo, model.*, actor.*, critic.* come from the checkpoint); "
                              f"eval.*, gconfig.*, rollout.*, data.* and trainer.* can change")
        if key.startswith("logger."):
            raise ConfigError(f"{shown} cannot be given to {subcommand}: it records nothing (no logger, run "
                              f"directory or MLflow run); the scores are printed")


def _keep_traceback(error: BaseException) -> Path | None:
    """Append the traceback of a stopped run to its run directory's ``error.log``; that file."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if run_dir and Path(run_dir).is_dir():
        try:
            with open(Path(run_dir) / "error.log", "a", encoding="utf-8") as log:
                log.write("".join(traceback.format_exception(error)))
        except OSError:  # the disk that failed the run may refuse the log too: the traceback goes to stderr
            return None
        return Path(run_dir) / "error.log"
    return None

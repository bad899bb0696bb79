"""The verbs every front door calls, in the order a run goes through them: the configs of a command that
starts from a checkpoint, read from it with the command's changes on top (``resume_fit`` for ``fit
--ckpt_path``, ``evaluation_tree`` for ``validate|test --ckpt_path``); ``check`` a LightningCLI tree (and
the checkpoint it resumes or scores) before anything loads; ``run`` it through LitPPOCLI in this process.
Over them, the jobs: ``fit`` (resume, check, note, run, the failure left pending), ``evaluate``
(``validate`` and ``test``), ``sft`` and ``rm``, the same sequence with LitSFT and SFTDataModule, LitRM and
RMDataModule; a new job is one more such verb. Lightning, the trained modules and the checkpoints' readers
are imported by the verbs that use them, so that ``check`` refuses a wrong value before any of them loads."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import yaml

from lit_ppo.config.keys import LIGHTNING_SECTIONS, set_key
from lit_ppo.config.rm import RMConfig
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.check import check_config, check_rm_config, check_sft_config
from lit_ppo.launch.compose import compose_run, real_model_note
from lit_ppo.launch.presets import is_group, typed_overrides
from lit_ppo.launch.rm import rm_tree
from lit_ppo.launch.sft import sft_tree
from lit_ppo.run.processes import launched_as_rank_zero
from lit_ppo.run.run_dir import check_job_run_dir, last_checkpoint
from lit_ppo.utils.cpu_contention import choose_wait_policy
from lit_ppo.utils.stop_requests import pending_failure

if TYPE_CHECKING:
    from lit_ppo.launch.lightning_cli import LitPPOCLI

TRAINED_SECTIONS = ("algo", "model", "actor", "critic", "rejection")
"""What the model in a checkpoint was trained as: LightningCLI restores it from the checkpoint."""
GROUP_KEYS = {"algo": "model.algo", "model": "model.model.source", "data": "data.task"}
"""Preset group -> the key of LightningCLI's tree that names what its option chose, which a resume compares
with the run's even where the option is the presets' default."""


def check(tree: dict, subcommand: str = "fit", ckpt_path: str | None = None) -> None:
    """ConfigError of one line for a mistake in the LightningCLI ``tree`` that ``subcommand`` would run
    (``lit_ppo.launch.check``) or in the checkpoint ``ckpt_path`` that it resumes or scores
    (``lit_ppo.run.resume.check_resume``); nothing is instantiated, no model loads."""
    check_config(tree, subcommand)
    if ckpt_path is not None:
        check_checkpoint(ckpt_path, tree)


def check_checkpoint(ckpt_path: str, tree: dict) -> None:
    """ConfigError of one line for a checkpoint ``ckpt_path`` that the run of LightningCLI's ``tree`` cannot
    resume or score (``lit_ppo.run.resume.check_resume``: damaged, another job's, another run's)."""
    from lit_ppo.run.resume import check_resume

    try:
        check_resume(ckpt_path, tree)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def choose_thread_waits() -> None:
    """Before a job's checks load torch: let its threads sleep while they wait if other processes keep the
    cores busy (``lit_ppo.utils.cpu_contention``), saying so on stderr. Rank 0 only: a launcher's ranks
    inherit its environment."""
    note = choose_wait_policy() if launched_as_rank_zero() else None
    if note is not None:
        print(note, file=sys.stderr, flush=True)


def run(subcommand: str, tree: dict | None, ckpt_path: str | None = None, *, flags: Sequence[str] = (),
        builder: Callable[[list[str]], LitPPOCLI] | None = None) -> LitPPOCLI:
    """Run ``subcommand`` (``fit``, ``validate``, ``test``) of the LightningCLI ``tree`` (``check`` it first)
    in this process; the finished LitPPOCLI. LitPPOCLI reads the tree from a temporary YAML, removed when
    the run ends, however it ends. ``ckpt_path``: the checkpoint it resumes or scores; ``flags``: more
    LightningCLI arguments (``--print_config``, ``--trainer.max_steps 3``); ``tree`` None: ``flags`` name
    the config files (``--config run.yaml``); ``builder``: a subclass of LitPPOCLI (a Ray worker's)."""
    from lit_ppo.launch.lightning_cli import LitPPOCLI

    builder = builder or LitPPOCLI
    args = [*flags, *(["--ckpt_path", str(ckpt_path)] if ckpt_path is not None else [])]
    if tree is None:
        return builder([subcommand, *args])
    with _config_file(tree) as path:
        return builder([subcommand, "--config", path, *args])


class RunFailed(RunStopped):
    """A failure that ended a run after an iteration, which ``last.ckpt`` holds (``pending_failure``): its
    one line says all there is; no traceback belongs to it."""


def fail_if_pending() -> None:
    """RunFailed for a failure that ended the run that just returned (a tracking store gone, an invalid
    reward): Lightning ends such a run as if it had finished."""
    failure = pending_failure()
    if failure is not None:
        raise RunFailed(failure)


def note_real_model(tree: dict) -> None:
    """The ``note:`` line of a fit whose model is not the tiny one (``real_model_note``), once its config passed
    every check: the settings it trains with are final. Rank 0 only: a launcher's ranks run the command again."""
    note = real_model_note(tree) if launched_as_rank_zero() else None
    if note is not None:
        print(note, file=sys.stderr, flush=True)


def fit(tree: dict, ckpt_path: str | None = None, *, overrides: list[str] | None = None,
        flags: Sequence[str] = (), resumed: bool = False) -> LitPPOCLI:
    """Train the run of LightningCLI's ``tree`` in this process: from the run that ``ckpt_path`` records, with
    what ``tree`` changes named (``resume_fit``; ``overrides``: the command line's that composed it), checked,
    its real model's settings noted, run (``flags``: more LightningCLI arguments); RunFailed for a failure
    that ended it after an iteration. ``resumed``: ``tree`` and ``ckpt_path`` are what ``resume_fit`` returned
    already (its notes said). The finished LitPPOCLI."""
    if not resumed:
        resumed_run = resume_fit(ckpt_path, tree, overrides)
        if resumed_run is not None:
            tree, ckpt_path = resumed_run
    check(tree, "fit", ckpt_path)
    if launched_as_rank_zero():
        check_job_run_dir()
    note_real_model(tree)
    cli = run("fit", tree, ckpt_path, flags=flags)
    fail_if_pending()
    return cli


def evaluate(subcommand: str, tree: dict, ckpt_path: str | None, *, recorded: bool = False,
             flags: Sequence[str] = ()) -> LitPPOCLI:
    """``validate`` or ``test`` (``subcommand``) the checkpoint ``ckpt_path`` under LightningCLI's ``tree`` in
    this process, checked with the checkpoint (``recorded``: ``tree`` is the one it records, as
    ``evaluation_tree`` read it, which matches it); RunFailed for a failure that ended it. The finished LitPPOCLI."""
    check(tree, subcommand, None if recorded else ckpt_path)
    cli = run(subcommand, tree, ckpt_path, flags=flags)
    fail_if_pending()
    return cli


def sft(tree: dict, ckpt_path: str | None = None, *, overrides: list[str] | None = None) -> LitPPOCLI:
    """Fine-tune as the sft job's LightningCLI ``tree`` says (``lit_ppo.launch.sft.sft_tree``) in this process,
    through fit's sequence: resumed (``overrides``: the command line's, ``sft.*`` included), checked
    (``check_sft_config``, and the checkpoint as fit's: ``check_checkpoint``), run, RunFailed for a failure that
    ended it. The finished LitPPOCLI; the model directory it wrote is ``<run dir>/model``, which its summary
    names with the ``fit model=<dir>`` that starts from it."""
    return _train_job(tree, ckpt_path, overrides, lambda: sft_tree(compose_run([])[0], SFTConfig()),
                      check_sft_config, _sft_cli)


def rm(tree: dict, ckpt_path: str | None = None, *, overrides: list[str] | None = None) -> LitPPOCLI:
    """Train a reward model as the rm job's LightningCLI ``tree`` says (``lit_ppo.launch.rm.rm_tree``) in this
    process, through sft's sequence (``overrides``: the command line's, ``rm.*`` included; ``check_rm_config``).
    The finished LitPPOCLI; the reward model directory it wrote, ``<run dir>/model``, is what
    ``data.task_kwargs.reward_fns`` takes."""
    return _train_job(tree, ckpt_path, overrides, lambda: rm_tree(compose_run([])[0], RMConfig()), check_rm_config,
                      _rm_cli)


def _train_job(tree: dict, ckpt_path: str | None, overrides: list[str] | None, presets: Callable[[], dict],
               check_job_config: Callable[[dict], None], builder: Callable[[list[str]], LitPPOCLI]) -> LitPPOCLI:
    """A job that trains a model on examples (sft, rm) through fit's sequence: resumed from ``ckpt_path`` with
    what ``overrides`` change of the job's ``presets()`` tree (composed only for a resume), checked
    (``check_job_config``, and the checkpoint as fit's: ``check_checkpoint``), run by ``builder``'s LitPPOCLI,
    RunFailed for a failure that ended it. The finished LitPPOCLI."""
    if ckpt_path is not None:
        resumed = resume_fit(ckpt_path, tree, overrides, presets=presets())
        if resumed is not None:
            tree, ckpt_path = resumed
    check_job_config(tree)
    if ckpt_path is not None:
        check_checkpoint(ckpt_path, tree)
    cli = run("fit", tree, ckpt_path, builder=builder)
    fail_if_pending()
    return cli


def _sft_cli(args: list[str]) -> LitPPOCLI:
    """LitPPOCLI of the sft job."""
    from lit_ppo.launch.lightning_cli import LitPPOCLI
    from lit_ppo.training.sft import LitSFT
    from lit_ppo.training.sft_data import SFTDataModule

    return LitPPOCLI(args, model_class=LitSFT, datamodule_class=SFTDataModule)


def _rm_cli(args: list[str]) -> LitPPOCLI:
    """LitPPOCLI of the rm job."""
    from lit_ppo.launch.lightning_cli import LitPPOCLI
    from lit_ppo.training.rm import LitRM
    from lit_ppo.training.rm_data import RMDataModule

    return LitPPOCLI(args, model_class=LitRM, datamodule_class=RMDataModule)


@contextmanager
def _config_file(tree: dict) -> Iterator[str]:
    """The path of a temporary YAML file holding ``tree``, removed on leaving."""
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="lit_ppo_", delete=False)
    try:
        with handle:
            yaml.safe_dump(tree, handle, sort_keys=False)
        yield handle.name
    finally:
        os.unlink(handle.name)


def resume_fit(ckpt_path: str | None, given: dict, overrides: list[str] | None = None,
               presets: dict | None = None) -> tuple[dict, str] | None:
    """``fit --ckpt_path CKPT`` (and ``sft``'s): the run's config recorded in the checkpoint with what this
    command gives set on top (``resumed_config``: each change named, those the checkpoint cannot follow
    refused), and the checkpoint's path (``last`` resolved by ``last_checkpoint``); None without ``ckpt_path``
    or for a checkpoint that records no config. ConfigError for a checkpoint of another job than ``given``'s
    (``check_job``), before any note. ``given``: a whole config (a ``--config`` file's, the Python API's), or,
    with ``overrides``, the tree they composed, of which only what they set counts: the keys they name and
    those whose value differs from the job's ``presets`` tree (None: fit's)."""
    if ckpt_path is None:
        return None
    from lit_ppo.run.continued import forget_continued_runs
    from lit_ppo.run.resume import check_job, job_of, recorded_config, resumed_config

    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(given))
    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if text is None:
        return None
    recorded = {k: v for k, v in yaml.safe_load(text).items() if k in LIGHTNING_SECTIONS}
    check_job(ckpt_path, recorded, job_of(given))
    forget_continued_runs(recorded)
    given = {k: v for k, v in given.items() if k in LIGHTNING_SECTIONS}
    if overrides is not None:
        given = _overridden(given, overrides, compose_run([])[0] if presets is None else presets)
    tree, notes = resumed_config(ckpt_path, recorded, given)
    if launched_as_rank_zero():  # the ranks a launcher starts run this command again
        for note in notes:
            print(note, file=sys.stderr, flush=True)
    return tree, ckpt_path


def _overridden(tree: dict, overrides: list[str], presets: dict) -> dict:
    """The part of the composed ``tree`` that ``overrides`` set: the keys they name (``checkpoint.keep``: the
    argument of the checkpoint callback it sets), the keys whose value differs from the ``presets`` tree's and
    the key each chosen group names (``GROUP_KEYS``). A list's items that they set are ``ListItems`` of what
    they set of each (one argument of one callback), a list they name is whole."""
    from lit_ppo.run.resume import config_changes, lightning_keys

    keys = [GROUP_KEYS[o.lstrip("+~").split("=", 1)[0]] for o in overrides
            if is_group(o) and o.lstrip("+~").split("=", 1)[0] in GROUP_KEYS]
    for override in typed_overrides(overrides):
        if not is_group(override):
            keys += lightning_keys(override.lstrip("+~").split("=", 1)[0], tree)
    keys += [key for key, _, _ in config_changes(presets, tree)]
    out: dict = {}
    for key in keys:
        _take(tree, key.split("."), out)
    return out


def _take(node: dict | list, parts: list[str], target: dict) -> None:
    """Copy what the dotted key ``parts`` names in ``node`` (a mapping or list of the composed tree) into
    ``target`` (its part of ``_overridden``'s tree): a leaf, or a value that the key names whole, as it is;
    on the way down, a list as ``ListItems`` and a callback as its ``class_path``, which finds it in the
    resumed list."""
    from lit_ppo.run.resume import ListItems

    name: str | int = parts[0]
    if isinstance(node, list):
        if not parts[0].isdigit() or int(parts[0]) >= len(node):
            return
        name = int(parts[0])
    elif name not in node:
        return
    child, rest = node[name], parts[1:]
    if not (isinstance(child, dict) and rest or isinstance(child, list) and rest and rest[0].isdigit()):
        target[name] = child
        return
    if target.get(name) is child:
        return  # named whole already
    if name not in target:
        target[name] = ListItems() if isinstance(child, list) else (
            {"class_path": child["class_path"]} if "class_path" in child else {})
    _take(child, rest, target[name])


def evaluation_tree(subcommand: str, ckpt_path: str, overrides: list[str]) -> dict | None:
    """The config of ``validate`` / ``test --ckpt_path``: the run's own, recorded in the checkpoint,
    with ``key=value`` overrides on top (e.g. ``eval.k=16``); None for a checkpoint that records none
    (then the overrides are fit's, composed from the presets). ConfigError for an sft or rm checkpoint and for an
    override of the model's settings, which the checkpoint's replace."""
    from lit_ppo.run.resume import job_of, recorded_config

    try:
        text = recorded_config(ckpt_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    job = job_of(yaml.safe_load(text) or {}) if text is not None else "fit"
    if job == "rm":
        raise ConfigError(f"--ckpt_path {ckpt_path}: was written by rm, a reward model's run, which has no policy to "
                          f"score: {subcommand} scores fit's checkpoints; its run directory's model/ is a reward for "
                          f"fit: 'data.task_kwargs.reward_fns=[<run dir>/model]'")
    if job == "sft":
        raise ConfigError(f"--ckpt_path {ckpt_path}: was written by sft, whose run has no task to score: {subcommand} "
                          f"scores fit's checkpoints; score its model on a task instead: python -m lit_ppo export "
                          f"--ckpt_path {ckpt_path} --output DIR, then python -m lit_ppo {subcommand} model=DIR")
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

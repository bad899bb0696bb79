"""The verbs every front door calls, in the order a run goes through them: the configs of a command that
starts from a checkpoint, read from it with the command's changes on top (``resume_fit`` for ``fit
--ckpt_path``, ``evaluation_tree`` for ``validate|test --ckpt_path``); ``check`` a LightningCLI tree (and
the checkpoint it resumes or scores) before anything loads; ``run`` it through LitPPOCLI in this process.
Over them, the jobs: ``fit`` (resume, check, note, run, the failure left pending), ``evaluate``
(``validate`` and ``test``) and ``sft``, the same sequence with LitSFT and SFTDataModule; a new job is one
more such verb."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from lit_ppo.config.keys import LIGHTNING_SECTIONS, lightning_path, set_key
from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.check import check_config, check_sft_config
from lit_ppo.launch.compose import compose_run, real_model_note
from lit_ppo.launch.lightning_cli import LitPPOCLI
from lit_ppo.launch.presets import is_group, typed_overrides
from lit_ppo.launch.sft import sft_tree
from lit_ppo.run.continued import forget_continued_runs
from lit_ppo.run.processes import launched_as_rank_zero
from lit_ppo.run.resume import check_resume, config_changes, recorded_config, resumed_config
from lit_ppo.run.run_dir import last_checkpoint
from lit_ppo.training.sft import LitSFT
from lit_ppo.training.sft_data import SFTDataModule
from lit_ppo.utils.stop_requests import pending_failure

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
        try:
            check_resume(ckpt_path, tree)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def run(subcommand: str, tree: dict | None, ckpt_path: str | None = None, *, flags: Sequence[str] = (),
        builder: Callable[[list[str]], LitPPOCLI] | None = None) -> LitPPOCLI:
    """Run ``subcommand`` (``fit``, ``validate``, ``test``) of the LightningCLI ``tree`` (``check`` it first)
    in this process; the finished LitPPOCLI. LitPPOCLI reads the tree from a temporary YAML, removed when
    the run ends, however it ends. ``ckpt_path``: the checkpoint it resumes or scores; ``flags``: more
    LightningCLI arguments (``--print_config``, ``--trainer.max_steps 3``); ``tree`` None: ``flags`` name
    the config files (``--config run.yaml``); ``builder``: a subclass of LitPPOCLI (a Ray worker's)."""
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


SFT_CLI = functools.partial(LitPPOCLI, model_class=LitSFT, datamodule_class=SFTDataModule)
"""LitPPOCLI of the sft job."""


def sft(tree: dict, ckpt_path: str | None = None, *, overrides: list[str] | None = None) -> Path:
    """Fine-tune as the sft job's LightningCLI ``tree`` says (``lit_ppo.launch.sft.sft_tree``) in this process,
    through fit's sequence: resumed, checked (``check_sft_config``), run, RunFailed for a failure that ended it.
    The model directory it wrote, which its summary names with the ``fit model=<dir>`` that starts from it."""
    if ckpt_path is not None:
        resumed = resume_fit(ckpt_path, tree, overrides, presets=sft_tree(compose_run([])[0], SFTConfig()))
        if resumed is not None:
            tree, ckpt_path = resumed
    check_sft_config(tree)
    trainer = run("fit", tree, ckpt_path, builder=SFT_CLI).trainer
    fail_if_pending()
    return Path(trainer.default_root_dir) / "model"


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
    """``fit --ckpt_path CKPT``: the run's config recorded in the checkpoint with what this command gives set
    on top (``resumed_config``: each change named, those the checkpoint cannot follow refused), and the
    checkpoint's path (``last`` resolved by ``last_checkpoint``); None without ``ckpt_path`` or for a
    checkpoint that records no config. ``given``: a whole config (a ``--config`` file's, the Python API's),
    or, with ``overrides``, the tree they composed, of which only what they set counts: the keys they name
    and those whose value differs from the job's ``presets`` tree (None: fit's)."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        ckpt_path = str(last_checkpoint(given))
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
        given = _overridden(given, overrides, compose_run([])[0] if presets is None else presets)
    tree, notes = resumed_config(ckpt_path, recorded, given)
    if launched_as_rank_zero():  # the ranks a launcher starts run this command again
        for note in notes:
            print(note, file=sys.stderr, flush=True)
    return tree, ckpt_path


def _overridden(tree: dict, overrides: list[str], presets: dict) -> dict:
    """The part of the composed ``tree`` that ``overrides`` set: the keys they name, the keys whose value
    differs from the ``presets`` tree's and the key each chosen group names (``GROUP_KEYS``); a list as a whole."""
    keys = [GROUP_KEYS[o.lstrip("+~").split("=", 1)[0]] for o in overrides
            if is_group(o) and o.lstrip("+~").split("=", 1)[0] in GROUP_KEYS]
    for override in typed_overrides(overrides):
        path = None if is_group(override) else lightning_path(override.lstrip("+~").split("=", 1)[0])
        if path is not None:
            keys.append(".".join(path))
    keys += [key for key, _, _ in config_changes(presets, tree)]
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

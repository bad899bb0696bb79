"""Resuming a run: the checkpoint must be readable, whole, finite, written by the same job (``fit`` or ``sft``,
``check_job``) and made with the same algorithm, model and task as the run (``check_resume``, called by the
CLI before any model loads); the run it continues (``recorded_run``) and the config it was trained with
(``recorded_config``) are read from it, and the command's changes set on top of that config
(``resumed_config``), each named by the key the command line types."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from lit_ppo.config.checkpoint import CALLBACK_ARGUMENTS, CHECKPOINT_CALLBACK, checkpoint_key
from lit_ppo.config.keys import lightning_path, typed_key
from lit_ppo.config.rm import RM_ALGO
from lit_ppo.errors import ConfigError
from lit_ppo.training.checkpoint_files import (
    DISTRIBUTED_META,
    PERIODIC_NAME,
    is_distributed_checkpoint,
    read_checkpoint,
)
from lit_ppo.training.record import DATA_DIGEST_SUFFIX, RECORD_KEY, RUN_KEY, SFT_ALGO, expected_record

CONFIG_STATE_KEY = "lit_ppo_config"
"""Key of the run's resolved config (YAML text) in TrackedConfig's checkpoint state."""
LIGHTNING_CKPT_VALUES = ("last", "best", "hpc", "registry")
"""``ckpt_path`` values that Lightning resolves itself, later, to a file of its choosing."""



def _differences(saved: dict, expected: dict) -> list[str]:
    """``key (old in the checkpoint, new in this run)`` for every key whose value differs."""
    keys = list(expected) + [k for k in saved if k not in expected]
    out = []
    for key in keys:
        was = repr(saved[key]) if key in saved else "absent"
        now = repr(expected[key]) if key in expected else "absent"
        if key not in saved or key not in expected or saved[key] != expected[key]:
            out.append(f"{key} ({was} in the checkpoint, {now} in this run)")
    return out



def job_of(tree: dict) -> str:
    """The job that LightningCLI's config ``tree`` runs: ``sft`` or ``rm`` (its model's algo names it) or ``fit``."""
    algo = (tree.get("model") or {}).get("algo")
    return algo if algo in (SFT_ALGO, RM_ALGO) else "fit"


def check_job(ckpt_path: str, recorded: dict, job: str) -> None:
    """ConfigError of one line when the checkpoint ``ckpt_path``, whose recorded config is ``recorded``, was
    written by another job than ``job``: its optimizer, schedule and data position are that job's, so resuming
    it would carry them over; the job starts from the checkpoint's model instead."""
    written_by = job_of(recorded)
    if written_by == job:
        return
    algo = (recorded.get("model") or {}).get("algo")
    maker = written_by if written_by != "fit" else f"fit (algo={algo})"
    # A reward model is no policy to start from: it is what fit scores with.
    start = (f"its reward model is a reward for fit: python -m lit_ppo export --ckpt_path {ckpt_path} --output DIR, "
             f"then python -m lit_ppo fit 'data.task_kwargs.reward_fns=[DIR]'" if written_by == RM_ALGO else
             f"start {job} from its model instead: python -m lit_ppo export --ckpt_path {ckpt_path} --output DIR, "
             f"then python -m lit_ppo {job} model=DIR")
    raise ConfigError(f"--ckpt_path {ckpt_path}: was written by {maker}, not by {job}: {job} resumes only its own "
                      f"checkpoints (the optimizer, schedule and data position are the job's); {start}")


def check_resume(ckpt_path: str, tree: dict) -> None:
    """Refuse, with one-line ValueError naming the file, a ``--ckpt_path`` this run cannot resume
    from: missing, a directory, unreadable, not loadable (truncated, corrupted), failing its digest,
    holding non-finite weights / optimizer state, written by another job (``check_job``) or made with a
    different algorithm, model or task than ``tree`` (LightningCLI's config tree); a data file whose
    content changed at the same path only gets a ``note:`` line on stderr. Lightning's own values
    ('last', 'best', 'hpc', 'registry[:...]') and remote URLs are left to the trainer."""
    path = os.fspath(ckpt_path)
    if path in LIGHTNING_CKPT_VALUES or path.startswith("registry:") or "://" in path:
        return
    where = f"--ckpt_path {path}"
    checkpoint = read_checkpoint(path)
    text = _config_text(checkpoint)
    if text is not None:
        try:
            check_job(path, yaml.safe_load(text) or {}, job_of(tree))
        except ConfigError as e:
            raise ValueError(str(e)) from None
    saved = checkpoint.get(RECORD_KEY)
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: was not written by lit_ppo (no '{RECORD_KEY}' record of its algo, model and task)")
    recorded, expected = {k: v for k, v in saved.items() if k != RUN_KEY}, expected_record(tree)
    differences = _differences(*({k: v for k, v in record.items() if not k.endswith(DATA_DIGEST_SUFFIX)}
                                 for record in (recorded, expected)))
    if differences:
        raise ValueError(f"{where}: was made with a different run: {'; '.join(differences)}")
    # A data file fixed at the same path is no reason to refuse, but the run must say it reads other data
    # (a checkpoint written without digests says nothing).
    for key, digest in expected.items():
        if key.endswith(DATA_DIGEST_SUFFIX) and recorded.get(key, digest) != digest:
            name = key.removesuffix(DATA_DIGEST_SUFFIX)
            print(f"note: {where}: data.task_kwargs.{name.removeprefix('task.')}={expected[name]} changed since "
                  f"the checkpoint was written (its SHA-256 differs): the resumed run trains on the changed data",
                  file=sys.stderr, flush=True)



def recorded_run(ckpt_path: str | None) -> dict[str, str] | None:
    """The ``run`` entry of the record of the local checkpoint ``ckpt_path`` ({} for a checkpoint that
    records no run); None without a local file (no ``ckpt_path``, Lightning's own values, URLs).
    ``check_resume`` has verified the file; loading it memory-mapped reads the record only."""
    if ckpt_path in (None, "") or not (os.path.isfile(ckpt_path) or is_distributed_checkpoint(ckpt_path)):
        return None
    record = _unverified(ckpt_path).get(RECORD_KEY)
    return dict(record.get(RUN_KEY) or {}) if isinstance(record, dict) else {}



def recorded_config(ckpt_path: str) -> str | None:
    """The resolved config (YAML text) that the local checkpoint ``ckpt_path`` was trained with, as
    ``lit_ppo.run.tracked_run.TrackedConfig`` stores it; None if it holds none (a checkpoint written by a
    Trainer of the user's own) or is no local file. A damaged file is a one-line ValueError
    (``read_checkpoint``)."""
    if os.fspath(ckpt_path) in LIGHTNING_CKPT_VALUES or "://" in os.fspath(ckpt_path):
        return None
    return _config_text(read_checkpoint(ckpt_path))


def _config_text(checkpoint: dict) -> str | None:
    """The resolved config (YAML text) that ``checkpoint`` holds in TrackedConfig's state; None if none."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and isinstance(state.get(CONFIG_STATE_KEY), str):
            return state[CONFIG_STATE_KEY]
    return None


FIXED_ON_RESUME = ("seed_everything", "model.algo", "model.model", "data.task", "data.task_kwargs", "data.batch_size",
                   "data.gconfig.n_samples", "data.seed")
"""Keys (and the keys under them) that a resume cannot change: the checkpoint's weights, optimizer state and
prompt stream position were made with them (the algorithm, the model and its LoRA shapes, the task and its
data, the groups per batch and samples per group, the prompt order). Whether there is a critic
(``model.critic`` itself) is fixed too; its settings are not."""
SFT_SECTION = "data.sft"
"""Where LightningCLI's tree of the sft job holds the ``sft`` section (``lit_ppo.launch.sft.sft_tree``)."""
FIXED_ON_SFT_RESUME = tuple(f"{SFT_SECTION}.{name}" for name in ("batch_size", "shuffle", "completion_key",
                                                                 "completion_template"))
"""The sft keys that a resume cannot change: the run's batches, one list over its epochs that a resume takes
up at its step, and the completions they train on were made with them (``sft.epochs`` and ``sft.max_length``
can change)."""
RM_SECTION = "data.rm"
"""Where LightningCLI's tree of the rm job holds the ``rm`` section (``lit_ppo.launch.rm.rm_tree``)."""
FIXED_ON_RM_RESUME = tuple(f"{RM_SECTION}.{name}" for name in ("batch_size", "shuffle", "pairs_fn"))
"""The rm keys that a resume cannot change, as sft's: its batches and their pairs were made with them."""
ADJUSTABLE_MODEL_KEYS = ("model.model.cache_dir", "model.model.logprob_chunk_size",
                         "model.model.gradient_checkpointing")
"""Model settings that change how the model is computed, not what it is."""
_ABSENT = object()


def is_fixed_on_resume(key: str) -> bool:
    """Whether LightningCLI's dotted ``key`` is one a resume cannot change (``FIXED_ON_RESUME``)."""
    if key in ADJUSTABLE_MODEL_KEYS:
        return False
    return key == "model.critic" or any(key == fixed or key.startswith(fixed + ".")
                                        for fixed in (*FIXED_ON_RESUME, *FIXED_ON_SFT_RESUME, *FIXED_ON_RM_RESUME))


class ListItems(dict):
    """Some items of a list of the config, by index (each a mapping of what is set of it; a callback's
    ``class_path`` names it): what a command sets of a list, such as one argument of one callback, on top of
    the list it resumes, whose other items and keys stay as they are."""


def _set_items(recorded: list, given: ListItems, key: str, changes: list[tuple[str, Any, Any]]) -> list:
    """``given``'s items set on top of the ``recorded`` list: each on the item of the same index, or for a
    callback, of its ``class_path`` (where the two lists order their callbacks differently); an item that the
    list lacks is appended."""
    out = list(recorded)
    for index, item in given.items():
        class_path = item.get("class_path") if isinstance(item, dict) else None
        if class_path is not None:
            same = [i for i, old in enumerate(out) if isinstance(old, dict) and old.get("class_path") == class_path]
            index = index if index in same else same[0] if same else len(out)
        if index < len(out):
            out[index] = _overlay(out[index], item, f"{key}.{index}", changes)
        else:
            out.append(_overlay(_ABSENT, item, f"{key}.{len(out)}", changes))
    return out


def _overlay(recorded: Any, given: Any, key: str, changes: list[tuple[str, Any, Any]]) -> Any:
    """``given`` set on top of ``recorded`` (mappings key by key, lists of one length item by item), each
    leaf that differs added to ``changes`` as ``(dotted key, recorded value, given value)``."""
    if isinstance(given, ListItems) and isinstance(recorded, list):
        return _set_items(recorded, given, key, changes)
    if isinstance(given, dict) and given and isinstance(recorded, dict):
        out = dict(recorded)
        for name, value in given.items():
            out[name] = _overlay(recorded.get(name, _ABSENT), value, f"{key}.{name}" if key else str(name), changes)
        return out
    if isinstance(given, list) and isinstance(recorded, list) and len(given) == len(recorded):
        return [_overlay(old, new, f"{key}.{i}", changes) for i, (old, new) in enumerate(zip(recorded, given))]
    if recorded is _ABSENT or recorded != given:
        changes.append((key, None if recorded is _ABSENT else recorded, given))
    return given


def config_changes(recorded: dict, given: dict) -> list[tuple[str, Any, Any]]:
    """``(dotted key, recorded value, given value)`` of every leaf of the config tree ``given`` that differs
    from ``recorded`` (mappings key by key, lists of one length item by item)."""
    changes: list[tuple[str, Any, Any]] = []
    _overlay(recorded, given, "", changes)
    return changes


def _shown(value: Any) -> str:
    """A config value as the command line would type it (cut where it is long: a callback list)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def shown_key(key: str, tree: dict) -> str:
    """The command line's name of the dotted ``key`` of LightningCLI's ``tree``: ``checkpoint.keep`` for the
    ModelCheckpoint argument that the trainer presets set from it (``save_top_k``), ``sft.batch_size`` for
    ``data.sft.batch_size``, else ``typed_key``'s (``actor.optimizer.lr`` for ``model.actor.optimizer.lr``)."""
    parts = key.split(".")
    if parts[:2] == ["trainer", "callbacks"] and len(parts) == 5 and parts[2].isdigit() and parts[3] == "init_args":
        callbacks = (tree.get("trainer") or {}).get("callbacks") or []
        callback = callbacks[int(parts[2])] if int(parts[2]) < len(callbacks) else None
        name = checkpoint_key(parts[4]) if isinstance(callback, dict) and \
            callback.get("class_path") == CHECKPOINT_CALLBACK else None
        if name is not None:
            return name
    if key.startswith((SFT_SECTION + ".", RM_SECTION + ".")):
        return key.removeprefix("data.")
    return typed_key(key)


def lightning_keys(key: str, tree: dict) -> list[str]:
    """The dotted keys of LightningCLI's ``tree`` that the command line's ``key`` sets (``shown_key``'s
    inverse): ``checkpoint.keep`` the ``save_top_k`` of each checkpoint callback of its trainer section
    (``checkpoint`` both arguments), ``sft.batch_size`` ``data.sft.batch_size``, else ``lightning_path``'s."""
    section, _, name = key.partition(".")
    if section == "checkpoint":
        arguments = [CALLBACK_ARGUMENTS[name]] if name in CALLBACK_ARGUMENTS else [] if name else [
            *CALLBACK_ARGUMENTS.values()]
        callbacks = (tree.get("trainer") or {}).get("callbacks") or []
        return [f"trainer.callbacks.{i}.init_args.{argument}" for i, callback in enumerate(callbacks)
                if isinstance(callback, dict) and callback.get("class_path") == CHECKPOINT_CALLBACK
                for argument in arguments]
    if section in ("sft", "rm"):
        return [f"data.{section}.{name}" if name else f"data.{section}"]
    path = lightning_path(key)
    return [] if path is None else [".".join(path)]


def resumed_config(ckpt_path: str, recorded: dict, given: dict) -> tuple[dict, list[str]]:
    """The config that resuming ``ckpt_path`` runs with: the run's ``recorded`` config (LightningCLI's tree,
    as the checkpoint holds it) with the keys of ``given`` set on top (a list's items as ``ListItems`` says);
    and one ``note:`` line naming each change by the key the command line types (``shown_key``). ConfigError
    naming the first change that the checkpoint's state cannot follow (``FIXED_ON_RESUME``,
    ``FIXED_ON_SFT_RESUME``)."""
    changes: list[tuple[str, Any, Any]] = []
    tree = _overlay(recorded, given, "", changes) if given else recorded
    for key, was, now in changes:
        if is_fixed_on_resume(key):
            made = ("its batches and their completions were made with it"
                    if key.startswith((SFT_SECTION + ".", RM_SECTION + "."))
                    else "its weights, optimizer and prompt stream were made with it")
            raise ConfigError(f"{shown_key(key, tree)}={_shown(now)} cannot change when resuming --ckpt_path "
                              f"{ckpt_path} (the run had {_shown(was)}): {made}; resume without it, or start a new "
                              f"run")
    return tree, [f"note: resuming with {shown_key(key, tree)}={_shown(now)} (the run had {_shown(was)})"
                  for key, was, now in changes]


def checkpoint_step(ckpt_path: str | os.PathLike) -> int:
    """The iteration (``global_step``) that the local checkpoint ``ckpt_path`` holds (read memory-mapped)."""
    return int(_unverified(ckpt_path).get("global_step", 0))


def saved_step(path: Path) -> int:
    """The iteration of a checkpoint file of a run: from its name (``epoch=0-step=20.ckpt``), else from
    its content (``last.ckpt``); -1 for one that cannot be read."""
    named = PERIODIC_NAME.match(path.name)
    if named:
        return int(named.group(1))
    try:
        return checkpoint_step(path)
    except Exception:  # a damaged file is no newer state of the run
        return -1


def newest_checkpoint(directory: Path) -> Path:
    """The checkpoint of a run's ``checkpoints/`` ``directory`` that holds its latest iteration: ``last.ckpt``, or a
    newer periodic one where a kill came between writing that and ``last.ckpt`` (Lightning writes ``last.ckpt``
    after the periodic checkpoint and the retention that follows it)."""
    saved = [path for path in directory.iterdir() if path.name.endswith(".ckpt") and not path.name.startswith(".")]
    return max(saved, key=lambda path: (saved_step(path), path.name == "last.ckpt"))


def _unverified(ckpt_path: str | os.PathLike) -> dict:
    """The local checkpoint ``ckpt_path`` (a distributed one's ``meta.pt``) loaded memory-mapped and not
    verified: for reading its record and iteration (``check_resume`` verifies the file resumed)."""
    if is_distributed_checkpoint(ckpt_path):
        return torch.load(os.path.join(ckpt_path, DISTRIBUTED_META), map_location="cpu", weights_only=True)
    return torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)

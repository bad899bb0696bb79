"""Resuming a run: the checkpoint must be readable, whole, finite and made with the same algorithm, model
and task as the run (``check_resume``, called by the CLI before any model loads); the run it continues
(``recorded_run``) and the config it was trained with (``recorded_config``) are read from it."""

from __future__ import annotations

import os
import sys

import torch

from lit_ppo.training.checkpoint_io import DISTRIBUTED_META, is_distributed_checkpoint, read_checkpoint
from lit_ppo.training.record import DATA_DIGEST_SUFFIX, RECORD_KEY, RUN_KEY, expected_record
from lit_ppo.utils.flags import flag_value

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



def check_resume(ckpt_path: str, tree: dict) -> None:
    """Refuse, with one-line ValueError naming the file, a ``--ckpt_path`` this run cannot resume
    from: missing, a directory, unreadable, not loadable (truncated, corrupted), failing its digest,
    holding non-finite weights / optimizer state, or made with a different algorithm, model or task
    than ``tree`` (LightningCLI's config tree); a data file whose content changed at the same path
    only gets a ``note:`` line on stderr. Lightning's own values ('last', 'best', 'hpc',
    'registry[:...]') and remote URLs are left to the trainer."""
    path = os.fspath(ckpt_path)
    if path in LIGHTNING_CKPT_VALUES or path.startswith("registry:") or "://" in path:
        return
    where = f"--ckpt_path {path}"
    checkpoint = read_checkpoint(path)
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
    if ckpt_path in (None, "") or not os.path.exists(os.fspath(ckpt_path)):
        return None
    if is_distributed_checkpoint(ckpt_path):
        checkpoint = torch.load(os.path.join(ckpt_path, DISTRIBUTED_META), map_location="cpu", weights_only=True)
    elif os.path.isfile(ckpt_path):
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    else:
        return None
    record = checkpoint.get(RECORD_KEY)
    return dict(record.get(RUN_KEY) or {}) if isinstance(record, dict) else {}



def ckpt_path_arg(flags: list[str], config: dict | None = None) -> str | None:
    """The ``--ckpt_path`` of LightningCLI flags (``--ckpt_path X`` or ``--ckpt_path=X``; the last
    one wins, as in the parser), else the config's ``ckpt_path``; None when neither is given."""
    given = flag_value(flags, "--ckpt_path")
    value = given if given is not None else (config or {}).get("ckpt_path")
    return None if value in (None, "", "null", "None") else str(value)



def check_resume_args(flags: list[str], tree: dict, error: type[Exception] = ValueError) -> None:
    """``check_resume`` for the ``--ckpt_path`` in ``flags`` / ``tree``, if any; raises ``error``
    (the caller's one-line error type) with the message."""
    path = ckpt_path_arg(flags, tree)
    if path is None:
        return
    try:
        check_resume(path, tree)
    except ValueError as e:
        raise error(str(e)) from None



def recorded_config(ckpt_path: str) -> str | None:
    """The resolved config (YAML text) that the local checkpoint ``ckpt_path`` was trained with, as
    ``lit_ppo.run.tracking.TrackedConfig`` stores it; None if it holds none (a checkpoint written by a
    Trainer of the user's own) or is no local file. A damaged file is a one-line ValueError
    (``read_checkpoint``)."""
    if os.fspath(ckpt_path) in LIGHTNING_CKPT_VALUES or "://" in os.fspath(ckpt_path):
        return None
    for state in (read_checkpoint(ckpt_path).get("callbacks") or {}).values():
        if isinstance(state, dict) and isinstance(state.get(CONFIG_STATE_KEY), str):
            return state[CONFIG_STATE_KEY]
    return None

"""Checkpoint files: their content digest, their finiteness, atomic writes and verified reads, without
Lightning (what a resume checks before anything heavy loads reads them here).

Content digest: ``torch.load`` does not check the zip CRC of tensor records, so a flipped bit in a
weight loads silently. Every checkpoint written by lit_ppo therefore carries the SHA-256 of its content
(each tensor's key path, dtype, shape and bytes; each plain value) under ``content_sha256``. It is
inside the file, so it is replaced atomically with it and travels with every copy (a sidecar file
could not be renamed together with the checkpoint). Reading recomputes it: ``read_checkpoint`` and
``AtomicCheckpointIO.load_checkpoint`` (``lit_ppo.training.checkpoint_io``) refuse a mismatch.
Checkpoints without a digest (other writers) are checked for loading and finiteness only.

Resuming (``read_checkpoint``, called by the command line before any model loads): the file must exist, be a
readable file, load, match its digest and hold finite weights and optimizer state; ``lit_ppo.run.resume``
then compares what made it with the run. A resume that changes the learning rate rescales the loaded
optimizer and schedule (``scale_lr``).

Distributed checkpoints (``trainer=fsdp``, ``lit_ppo.training.fsdp.FSDP2Strategy``) are directories of
shard files and a ``meta.pt`` holding everything else, the SHA-256 of every shard file
(``shard_sha256``) and the digest of ``meta.pt``'s own content: they get the same checks, per file.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from lit_ppo.utils.fs import file_sha256, write_file_atomically
from lit_ppo.utils.text import first_sentence

DIGEST_KEY = "content_sha256"
"""Top-level checkpoint key of the SHA-256 hex digest of everything else in the checkpoint."""
DISTRIBUTED_META = "meta.pt"
"""File of a distributed checkpoint directory holding all but the sharded tensors (Lightning's name)."""
SHARDS_KEY = "shard_sha256"
"""Entry of a distributed checkpoint's ``meta.pt``: ``{file name: SHA-256}`` of its other files."""
FINITE_SECTIONS = ("state_dict", "optimizer_states")
"""Checkpoint sections that must be finite. Callback state may hold infinities legitimately
(ModelCheckpoint's initial ``kth_value``, EarlyStopping's ``best_score``)."""
PLAIN_TYPES = (bool, int, float, str, bytes, type(None))
PERIODIC_NAME = re.compile(r"^epoch=\d+-step=(\d+)(?:-v\d+)?\.ckpt$")
"""ModelCheckpoint's default name of a periodic checkpoint; its group is the iteration it holds."""


# ---------------------------------------------------------------------------------------------
# content: digest and finiteness in one pass
# ---------------------------------------------------------------------------------------------

@dataclass
class ContentScan:
    """What one pass over a checkpoint found."""

    digest: str
    """SHA-256 hex digest of the content (the digest entry itself excluded)."""
    non_finite: str | None
    """Key path of the first non-finite weight / optimizer tensor, e.g.
    ``state_dict.policy.model.layers.0.mlp.up_proj.weight`` or ``optimizer_states[0].state.3.exp_avg``."""


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every node of a nested dict / list / tuple with its key path, containers included (so that
    an empty dict and an empty list hash differently)."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


def _tensor_bytes(tensor: torch.Tensor):
    """The tensor's logical content as a flat uint8 array (a buffer hashlib reads without a copy)."""
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy()


def scan(checkpoint: dict) -> ContentScan:
    """Digest of ``checkpoint`` and the first non-finite tensor of its ``FINITE_SECTIONS``."""
    digest = hashlib.sha256()
    non_finite = None
    for section, content in checkpoint.items():
        if section == DIGEST_KEY:
            continue
        must_be_finite = section in FINITE_SECTIONS
        for path, value in _walk(content, str(section)):
            digest.update(path.encode() + b"\0")
            if isinstance(value, torch.Tensor):
                digest.update(f"{value.dtype}{tuple(value.shape)}\0".encode())
                if (non_finite is None and must_be_finite and (value.is_floating_point() or value.is_complex())
                        and not bool(torch.isfinite(value.detach()).all())):
                    non_finite = path
                digest.update(_tensor_bytes(value))
            elif isinstance(value, (dict, list, tuple)):
                # The kind, not the class: an OrderedDict and the dict a loader may return are alike.
                kind = "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else "tuple"
                digest.update(f"{kind}:{len(value)}\0".encode())
            elif isinstance(value, PLAIN_TYPES):
                digest.update(f"{type(value).__name__}:{value!r}\0".encode())
            else:  # an arbitrary object: its repr may hold an address, so only its type counts
                digest.update(f"{type(value).__module__}.{type(value).__qualname__}\0".encode())
    return ContentScan(digest.hexdigest(), non_finite)


def content_problem(checkpoint: Any) -> str | None:
    """Why a loaded checkpoint must not be used (digest mismatch, non-finite tensor), or None."""
    if not isinstance(checkpoint, dict):
        return f"holds a {type(checkpoint).__name__}, not a checkpoint dict"
    result = scan(checkpoint)
    stored = checkpoint.get(DIGEST_KEY)
    if stored is not None and stored != result.digest:
        return "content does not match its digest (the file was corrupted after it was written)"
    if result.non_finite is not None:
        return f"holds a non-finite tensor at {result.non_finite}"
    return None


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------


def write_atomically(checkpoint: dict, path: str) -> None:
    """``torch.save(checkpoint)`` to the local ``path`` through ``write_file_atomically``."""
    write_file_atomically(path, lambda f: torch.save(checkpoint, f), "checkpoint")


def first_non_finite(sections: dict) -> str | None:
    """Key path of the first non-finite floating tensor in ``sections`` (a sharded one: this rank's
    shard), or None."""
    for path, value in _walk(sections, ""):
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            local = value.to_local() if hasattr(value, "to_local") else value
            if not bool(torch.isfinite(local.detach()).all()):
                return path
    return None


def write_meta(checkpoint: dict, shards: dict[str, str], path: str | os.PathLike) -> None:
    """``meta.pt`` of a distributed checkpoint: ``checkpoint`` (its tensors already in the shard
    files), the shard files' digests and the digest of this content, flushed and fsynced."""
    content = {**checkpoint, SHARDS_KEY: shards}
    content[DIGEST_KEY] = scan(content).digest
    with open(path, "wb") as f:
        torch.save(content, f)
        f.flush()
        os.fsync(f.fileno())


def is_distributed_checkpoint(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, DISTRIBUTED_META))


def _read_meta(path: str) -> tuple[dict | None, str | None]:
    """``(meta.pt content, None)`` of a distributed checkpoint directory, or ``(None, problem)``."""
    meta_file = os.path.join(path, DISTRIBUTED_META)
    if not os.access(meta_file, os.R_OK):
        return None, f"is not readable ({DISTRIBUTED_META}: permission denied)"
    try:
        meta = torch.load(meta_file, map_location="cpu", weights_only=True)
    except Exception as e:
        return None, (f"cannot be loaded, its {DISTRIBUTED_META} is truncated, corrupted or not a checkpoint "
                      f"({first_sentence(e)})")
    problem = content_problem(meta)
    if problem is not None:
        return None, f"{DISTRIBUTED_META}: {problem}"
    if not isinstance(meta.get(SHARDS_KEY), dict):
        return None, f"was not written by lit_ppo ({DISTRIBUTED_META} lists no shard digests)"
    return meta, None


def _verified_meta(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """``(meta.pt content, None)`` of a distributed checkpoint directory whose files all match their
    digests, or ``(None, problem)``."""
    meta, problem = _read_meta(os.fspath(path))
    if problem is not None:
        return None, problem
    for name, digest in meta[SHARDS_KEY].items():
        shard = os.path.join(path, name)
        if not os.path.isfile(shard):
            return None, f"is incomplete: shard file {name} is missing"
        if not os.access(shard, os.R_OK):
            return None, f"is not readable ({name}: permission denied)"
        if file_sha256(shard) != digest:
            return None, f"shard file {name} does not match its digest (it was corrupted after it was written)"
    return meta, None


def distributed_checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why the distributed checkpoint directory ``path`` must not be used (unreadable or corrupted
    ``meta.pt``, a shard file missing or differing from its digest), or None."""
    return _verified_meta(path)[1]


# ---------------------------------------------------------------------------------------------
# resuming
# ---------------------------------------------------------------------------------------------


def read_checkpoint(ckpt_path: str) -> dict:
    """The checkpoint at the local ``ckpt_path``, loaded on CPU (memory-mapped) and verified: a
    one-line ValueError naming ``--ckpt_path`` if it is missing, a directory, unreadable, not loadable,
    failing its digest or holding non-finite weights / optimizer state."""
    path = os.fspath(ckpt_path)
    where = f"--ckpt_path {path}"
    if not os.path.exists(path):
        directory, name = os.path.split(os.path.abspath(path))
        aside = sorted(e for e in os.listdir(directory) if e.startswith(f".{name}.old-")) \
            if os.path.isdir(directory) else []
        if aside:  # a save was killed between moving the old checkpoint aside and publishing the new one
            raise ValueError(f"{where}: no such file; an interrupted save left the previous checkpoint at "
                             f"{os.path.join(directory, aside[-1])} (rename it to {name} to use it)")
        raise ValueError(f"{where}: no such file")
    if is_distributed_checkpoint(path):
        meta, problem = _verified_meta(path)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        return meta
    if os.path.isdir(path):
        raise ValueError(f"{where}: is a directory, must be a checkpoint file (e.g. .../checkpoints/last.ckpt) "
                         f"or a distributed checkpoint directory (with a {DISTRIBUTED_META})")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{where}: is not readable (permission denied)")
    try:
        # mmap: tensors are paged in as they are checked instead of all being copied into memory.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch, pickle and zip readers raise many types for a damaged file
        raise ValueError(f"{where}: cannot be loaded, it is truncated, corrupted or not a checkpoint "
                         f"({first_sentence(e)})") from None
    problem = content_problem(checkpoint)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return checkpoint


def scale_lr(checkpoint: dict, index: int, factor: float) -> None:
    """Multiply the learning rates of optimizer ``index`` of a loaded ``checkpoint`` and of its schedule
    (current, initial and base) by ``factor``: a resume that changes the learning rate keeps the schedule's
    progress (``lit_ppo.run.tracked_run.TrackedConfig``)."""
    for group in checkpoint["optimizer_states"][index]["param_groups"]:
        for key in ("lr", "initial_lr"):
            if key in group:
                group[key] *= factor
    schedulers = checkpoint.get("lr_schedulers") or []
    if index < len(schedulers):
        for key in ("base_lrs", "_last_lr"):
            if key in schedulers[index]:
                schedulers[index][key] = [lr * factor for lr in schedulers[index][key]]

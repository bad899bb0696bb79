"""Checkpoint integrity: atomic writes, no non-finite state, verified loads and resumes.

Writing (``AtomicCheckpointIO``, which LitPPO installs on every trainer): a checkpoint whose weights
or optimizer state hold a non-finite value is refused before anything is written. Otherwise it is
streamed into ``<dir>/.<name>.tmp-<random>`` in the destination directory, flushed and fsynced,
renamed onto ``<dir>/<name>`` with ``os.replace`` (atomic within one filesystem) and the directory
is fsynced: whatever kills the process, ``<name>`` is the previous checkpoint or the new one, never
a partial file. Retention removes, with the periodic checkpoint it drops, any older one that a
killed process left behind (``remove_checkpoint``). A write the filesystem refuses (a full disk, a
quota, a read-only mount, the file size limit) stops the run in one line naming the file and the
reason (``RunStopped``), the temporary file removed and the previous checkpoint kept. Lightning's
``TorchCheckpointIO`` stages the file in ``$TMPDIR`` instead; when that is another filesystem its final
move is a copy over the existing checkpoint, and a kill during the copy leaves a truncated file.

Content digest: ``torch.load`` does not check the zip CRC of tensor records, so a flipped bit in a
weight loads silently. Every checkpoint written here therefore carries the SHA-256 of its content
(each tensor's key path, dtype, shape and bytes; each plain value) under ``content_sha256``. It is
inside the file, so it is replaced atomically with it and travels with every copy (a sidecar file
could not be renamed together with the checkpoint). Loading recomputes it: the plugin's
``load_checkpoint`` and ``check_resume`` refuse a mismatch. Checkpoints without a digest (other
writers) are checked for loading and finiteness only.

Resuming (``check_resume``, called by the CLI before any model loads): the file must exist, be a
readable file, load, match its digest, hold finite weights and optimizer state, and have been made
with the same algorithm, model and task as the run (``run_record``, stored under ``lit_ppo``). The
record also says where the run is recorded (its ``run`` entry, see ``lit_ppo.run.tracked_run.run_reference``),
so that the resumed run continues it; that entry is not compared. A resume that changes the learning rate
rescales the loaded optimizer and schedule (``scale_lr``).

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
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from lit_ppo.errors import RunStopped
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO with atomic local writes, a content digest and a refusal to
    write or load non-finite weights / optimizer state (see the module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint: storage_options is not supported, must be None")
        path = os.fspath(path)
        result = scan(checkpoint)
        if result.non_finite is not None:
            raise RunStopped(f"refusing to write checkpoint {path}: {result.non_finite} is non-finite "
                             f"(the previous checkpoint is kept)")
        content = {**checkpoint, DIGEST_KEY: result.digest}
        if "://" in path and not path.startswith("file://"):
            # Object stores replace an object in one request: a partial upload is never visible.
            super().save_checkpoint(content, path)
            return
        write_atomically(content, path.removeprefix("file://"))

    def remove_checkpoint(self, path) -> None:
        """Remove the periodic checkpoint that retention (ModelCheckpoint's ``save_top_k``) drops, and with
        it every older periodic checkpoint beside it: a process killed after writing a checkpoint and
        before removing the one it replaces leaves that one behind, and a resume from the newer one does
        not know it. Retention then converges at the next checkpoint written."""
        super().remove_checkpoint(path)
        local = os.fspath(path)
        if "://" in local and not local.startswith("file://"):
            return
        directory, name = os.path.split(local.removeprefix("file://"))
        dropped = PERIODIC_NAME.match(name)
        if dropped is None or not os.path.isdir(directory):
            return
        for entry in os.listdir(directory):
            older = PERIODIC_NAME.match(entry)
            if older is not None and int(older[1]) < int(dropped[1]):
                super().remove_checkpoint(os.path.join(directory, entry))

    def load_checkpoint(self, path, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        problem = content_problem(checkpoint)
        if problem is not None:
            raise RunStopped(f"checkpoint {os.fspath(path)} {problem}")
        return checkpoint


def install_checkpoint_io(strategy) -> None:
    """Make ``strategy`` write through ``AtomicCheckpointIO``, unless the user chose their own
    checkpoint IO; a wrapper (e.g. AsyncCheckpointIO) around the default gets it inside."""
    current = strategy.checkpoint_io  # the getter fills in Lightning's default when none was given
    if type(current) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(current, _WrappingCheckpointIO) and type(current.checkpoint_io) is TorchCheckpointIO:
        # The wrapper's public setter keeps an inner IO once set; the default one is replaced directly.
        current._checkpoint_io = AtomicCheckpointIO()


# ---------------------------------------------------------------------------------------------
# what a checkpoint was made with
# ---------------------------------------------------------------------------------------------


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

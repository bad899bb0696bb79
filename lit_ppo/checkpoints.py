"""Checkpoint integrity: atomic writes, no non-finite state, verified loads and resumes.

Writing (``AtomicCheckpointIO``, which LitPPO installs on every trainer): a checkpoint whose weights
or optimizer state hold a non-finite value is refused before anything is written. Otherwise it is
streamed into ``<dir>/.<name>.tmp-<random>`` in the destination directory, flushed and fsynced,
renamed onto ``<dir>/<name>`` with ``os.replace`` (atomic within one filesystem) and the directory
is fsynced: whatever kills the process, ``<name>`` is the previous checkpoint or the new one, never
a partial file. A write the filesystem refuses (a full disk, a quota, a read-only mount, the file size
limit) stops the run in one line naming the file and the reason (``RunStopped``), the temporary file
removed and the previous checkpoint kept. Lightning's ``TorchCheckpointIO`` stages the file in
``$TMPDIR`` instead; when that is another filesystem its final move is a copy over the existing
checkpoint, and a kill during the copy leaves a truncated file.

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
record also says where the run is recorded (its ``run`` entry, see ``lit_ppo.tracking.run_reference``),
so that the resumed run continues it; that entry is not compared.

Distributed checkpoints (``trainer=fsdp``, ``lit_ppo.fsdp.FSDP2Strategy``) are directories of
shard files and a ``meta.pt`` holding everything else, the SHA-256 of every shard file
(``shard_sha256``) and the digest of ``meta.pt``'s own content: they get the same checks, per file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import inspect
import os
import re
import secrets
import shutil
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from lit_ppo.cli_errors import flag_value
from lit_ppo.errors import RunStopped

DIGEST_KEY = "content_sha256"
"""Top-level checkpoint key of the SHA-256 hex digest of everything else in the checkpoint."""
RECORD_KEY = "lit_ppo"
"""Top-level checkpoint key of what the run was made with (see ``run_record``)."""
RUN_KEY = "run"
"""Entry of the record naming the run directory and MLflow run that a resume continues."""
DISTRIBUTED_META = "meta.pt"
"""File of a distributed checkpoint directory holding all but the sharded tensors (Lightning's name)."""
SHARDS_KEY = "shard_sha256"
"""Entry of a distributed checkpoint's ``meta.pt``: ``{file name: SHA-256}`` of its other files."""
FINITE_SECTIONS = ("state_dict", "optimizer_states")
"""Checkpoint sections that must be finite. Callback state may hold infinities legitimately
(ModelCheckpoint's initial ``kth_value``, EarlyStopping's ``best_score``)."""
LIGHTNING_CKPT_VALUES = ("last", "best", "hpc", "registry")
"""``ckpt_path`` values that Lightning resolves itself, later, to a file of its choosing."""
_PLAIN = (bool, int, float, str, bytes, type(None))


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
            elif isinstance(value, _PLAIN):
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

def _create_temp(directory: str, name: str) -> tuple[str, int]:
    """A new hidden file beside the destination; mode 0o666 lets the umask decide, as open() does."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(8)}")
        try:
            return path, os.open(path, flags, 0o666)
        except FileExistsError:
            continue


def _fsync_directory(directory: str) -> None:
    """Make the rename durable. Some filesystems cannot fsync a directory; the rename has happened
    by then, so that is not a failed save."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _remove_stale_temps(directory: str, name: str) -> None:
    """Temporary files of ``name`` left by writers that were killed (nothing can clean up after SIGKILL)."""
    prefix = f".{name}.tmp-"
    for entry in os.listdir(directory):
        if entry.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


def os_error(error: BaseException) -> OSError | None:
    """The operating system's error behind a failed write, or None: ``error`` itself, one it was
    raised from or while handling (``torch.save`` reports its file's failed write as a RuntimeError
    raised while handling the OSError), or the one that safetensors' writer names in its message
    (``... (os error 28)``)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        number = re.search(r"\(os error (\d+)\)", str(error))
        if number:
            return OSError(int(number[1]), os.strerror(int(number[1])))
        error = error.__cause__ or error.__context__
    return None


def write_file_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None], what: str) -> None:
    """``write(f)`` into a temporary file beside the local ``path``, fsynced and renamed onto it, so
    that ``path`` is never partially written. A write that the filesystem refuses (full, over quota,
    read-only, beyond the file size limit) is a RunStopped of one line naming ``what``, the file and the
    reason: the temporary file is removed and ``path`` keeps its previous content."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    temp = None
    try:
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temps(directory, name)  # first: on a full disk their room is needed
        temp, fd = _create_temp(directory, name)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: no temporary file is left behind
        if temp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        cause = os_error(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        kept = f"the previous {what} is kept" if os.path.exists(path) else f"no {what} was written"
        raise RunStopped(f"cannot write {what} {path}: {cause.strerror or cause} ({kept})") from e
    _fsync_directory(directory)


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


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def temporary_directory(path: str | os.PathLike) -> str:
    """A new hidden directory beside ``path`` to write its replacement into."""
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    while True:
        temp = os.path.join(directory, f".{name}.tmp-{secrets.token_hex(8)}")
        try:
            os.mkdir(temp)
            return temp
        except FileExistsError:
            continue


def write_meta(checkpoint: dict, shards: dict[str, str], path: str | os.PathLike) -> None:
    """``meta.pt`` of a distributed checkpoint: ``checkpoint`` (its tensors already in the shard
    files), the shard files' digests and the digest of this content, flushed and fsynced."""
    content = {**checkpoint, SHARDS_KEY: shards}
    content[DIGEST_KEY] = scan(content).digest
    with open(path, "wb") as f:
        torch.save(content, f)
        f.flush()
        os.fsync(f.fileno())


def replace_directory(temp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Publish the complete directory ``temp`` as ``path``. A directory cannot be renamed onto a
    non-empty one, so the old one moves aside first (to ``.<name>.old-<random>``): a kill between the
    two renames leaves it there, complete, and ``read_checkpoint`` names it; an error between them
    moves it back."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    for root, _, files in os.walk(temp):  # the files' data, before the renames make them visible
        for entry in files:
            with open(os.path.join(root, entry), "rb") as f:
                os.fsync(f.fileno())
    old = None
    if os.path.lexists(path):
        old = os.path.join(directory, f".{name}.old-{secrets.token_hex(8)}")
        os.rename(path, old)
    try:
        os.rename(temp, path)
    except BaseException:
        if old is not None:
            os.rename(old, path)
        raise
    _fsync_directory(directory)
    if old is not None:
        shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.unlink(old)


def remove_stale_directories(path: str | os.PathLike) -> None:
    """Temporary and set-aside directories of ``path`` left by killed writers."""
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        return
    for entry in os.listdir(directory):
        if entry.startswith((f".{name}.tmp-", f".{name}.old-")):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


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
                      f"({_first_sentence(e)})")
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

def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


def model_identity(source: str) -> str:
    """A model source as compared on resume: a local directory by its resolved path."""
    if source not in ("tiny", "smollm2") and os.path.isdir(os.path.expanduser(source)):
        return os.path.realpath(os.path.expanduser(source))
    return source


DATA_PATH_FIELDS = ("train_path", "test_path")
"""Task fields naming data files: the record holds their content's SHA-256 too (``task.<field>.sha256``)."""
DATA_DIGEST_SUFFIX = ".sha256"


def task_identity(task: Any) -> dict[str, Any]:
    """``task``'s class and its plain-valued dataclass init fields, as ``task`` / ``task.<field>``, and
    the content digest of the data files of ``DATA_PATH_FIELDS`` (``lit_ppo.tasks.dataset.data_digest``)."""
    cls = type(task)
    out: dict[str, Any] = {"task": f"{cls.__module__}.{cls.__qualname__}"}
    if dataclasses.is_dataclass(task):
        for f in dataclasses.fields(task):
            value = getattr(task, f.name, None)
            value = os.fspath(value) if isinstance(value, os.PathLike) else value
            if f.init and not f.name.startswith("_") and _plain(value):
                out[f"task.{f.name}"] = value
    for name in DATA_PATH_FIELDS:
        path = out.get(f"task.{name}")
        if isinstance(path, str) and os.path.exists(path):
            from lit_ppo.tasks.dataset import data_digest

            out[f"task.{name}{DATA_DIGEST_SUFFIX}"] = data_digest(path)
    return out


def run_record(module) -> dict[str, Any]:
    """What a LitPPO checkpoint is made with: algorithm, model source (and LoRA settings) and task, and
    where its run is recorded (stored under ``lit_ppo``)."""
    from lit_ppo.tracking import run_reference

    record = {"algo": module.algo, "model": model_identity(module.model_cfg.source), **lora_identity(module.model_cfg)}
    task = getattr(module.trainer.datamodule, "task", None)
    if task is not None:
        record.update(task_identity(task))
    record[RUN_KEY] = run_reference(module.trainer)
    return record


def expected_record(tree: dict) -> dict[str, Any]:
    """``run_record`` of the run that LightningCLI's config ``tree`` describes (builds the task, no model)."""
    from lit_ppo.data import RolloutDataModule
    from lit_ppo.module import LitPPO, ModelConfig

    model = tree.get("model") or {}
    algo = model.get("algo", inspect.signature(LitPPO.__init__).parameters["algo"].default)
    model_cfg = model.get("model") or {}
    source = model_cfg.source if isinstance(model_cfg, ModelConfig) else model_cfg.get("source", ModelConfig.source)
    data = tree.get("data") or {}
    task = RolloutDataModule(**{k: data[k] for k in ("task", "task_kwargs") if k in data}).task
    return {"algo": algo, "model": model_identity(source), **lora_identity(model_cfg), **task_identity(task)}


LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_target_modules")
"""Model settings a LoRA checkpoint is recorded with: its adapters' shapes, places and scaling."""


def lora_identity(model_cfg) -> dict[str, Any]:
    """``model.<field>`` of ``LORA_FIELDS`` of a LoRA model config (a ModelConfig or a mapping of
    its fields); {} without LoRA, so the records of other checkpoints are unchanged."""
    from lit_ppo.module import ModelConfig

    def get(name: str):
        value = getattr(model_cfg, name) if isinstance(model_cfg, ModelConfig) else model_cfg.get(
            name, getattr(ModelConfig, name))
        return list(value) if isinstance(value, tuple) else value

    return {f"model.{name}": get(name) for name in LORA_FIELDS} if get("lora_rank") else {}


# ---------------------------------------------------------------------------------------------
# resuming
# ---------------------------------------------------------------------------------------------

def _first_sentence(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(". ", 1)[0].rstrip(".")


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
                         f"({_first_sentence(e)})") from None
    problem = content_problem(checkpoint)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return checkpoint


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
    ``lit_ppo.tracking.TrackedConfig`` stores it; None if it holds none (a checkpoint written by a
    Trainer of the user's own) or is no local file. A damaged file is a one-line ValueError
    (``read_checkpoint``)."""
    from lit_ppo.tracking import CONFIG_STATE_KEY

    if os.fspath(ckpt_path) in LIGHTNING_CKPT_VALUES or "://" in os.fspath(ckpt_path):
        return None
    for state in (read_checkpoint(ckpt_path).get("callbacks") or {}).values():
        if isinstance(state, dict) and isinstance(state.get(CONFIG_STATE_KEY), str):
            return state[CONFIG_STATE_KEY]
    return None

"""Hugging Face model directories: what an export, a vLLM engine's start-up weights and a converted
model are written as, that transformers and vLLM load.

``write_model_dir`` publishes a directory whole: it is written into a temporary directory beside it
that then replaces it (``lit_ppo.utils.fs.replace_directory``), so it is never half written. Its files
get the modes of any new file (0o666 less the umask). An existing non-empty one is refused unless
``overwrite``; a place that cannot be written, or that is, contains or lies inside what is read, is
refused before anything is written (``check_output``, ``check_writable``, ``check_apart``). Its config.json
names the model's class (``architectures``), and it records the base model its weights descend from
(``lit_ppo.config.model.MODEL_RECORD``), whose settings a run from it then chooses.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import shutil
from pathlib import Path

import torch

from lit_ppo.config.model import MODEL_RECORD, base_model
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.utils.fs import os_error, remove_stale_directories, replace_directory, temporary_directory


def write_hf_files(model: torch.nn.Module, tokenizer, path: str | Path) -> None:
    """Write ``model`` and ``tokenizer`` into the directory ``path`` as a Hugging Face model, on every rank.

    transformers' ``save_pretrained`` skips the weights on any torch.distributed rank but 0, while
    each rank needs its own copy (a cache entry it builds, its vLLM engine's start-up checkpoint):
    the config, generation config and weights are written here instead. Tied weights are stored
    once, under their first name, as transformers does.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # The class that loads it, as save_pretrained records it: without it vLLM and AutoModel guess the bare
    # decoder (LlamaModel), and a causal LM cannot be told from a sequence classifier before its weights load.
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(path)


def check_output(output: Path, overwrite: bool, flag: str = "--output") -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{flag} {output}: is a file, must be a directory (new or empty)")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"{flag} {output}: exists and is not empty (give --overwrite to replace it)")


def check_writable(output: Path, flag: str) -> None:
    """ConfigError (one line) if the directory ``output`` cannot be created or replaced: its nearest
    existing ancestor is a file or not writable."""
    parent = output.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {output}: cannot be written, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        # access() refuses a read-only mount even to root, who may write anywhere else.
        reason = errno.EROFS if os.statvfs(parent).f_flag & os.ST_RDONLY else errno.EACCES
        raise ConfigError(f"{flag} {output}: cannot be written, {parent} is not writable ({os.strerror(reason)})")


def relation(output: str | Path, other: str | Path) -> str | None:
    """``"is"``, ``"contains"`` or ``"is inside"``: how the directory ``output`` relates to the path
    ``other``, each spelled as given (``~`` and ``..`` resolved) and with its symlinks resolved (a
    symlink is replaced with its directory); None when they are apart."""
    def spellings(path: str | Path) -> set[Path]:
        given = os.path.abspath(os.path.expanduser(path))
        return {Path(given), Path(os.path.realpath(given))}

    outs, reads = spellings(output), spellings(other)
    for how, test in (("is", lambda o, r: o == r), ("contains", lambda o, r: r.is_relative_to(o)),
                      ("is inside", lambda o, r: o.is_relative_to(r))):
        if any(test(o, r) for o in outs for r in reads):
            return how
    return None


def check_apart(output: Path, flag: str, reads: dict[str, Path]) -> None:
    for what, path in reads.items():
        found = relation(output, path)
        if found is not None:
            raise ConfigError(f"{flag} {output}: {found} {what} {path}, which export reads: "
                              f"give a directory apart from it")


def write_model_dir(model, tokenizer, output: str | Path, overwrite: bool = False, flag: str = "--output",
                    source: str | None = None, record: dict | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` (with its chat template) to ``output`` atomically; ``flag``
    names it in errors. ``source``: the model.source it was trained from, whose base model the directory
    records (``lit_ppo.config.model.MODEL_RECORD``); None records none. ``record``: more entries of that
    record (a reward model's statistics)."""
    from transformers import GenerationConfig

    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)

    def write(tmp: Path) -> None:
        write_hf_files(model, tokenizer, tmp)
        if source is not None:
            (tmp / MODEL_RECORD).write_text(json.dumps({"base_model": base_model(source), **(record or {})}) + "\n",
                                            encoding="utf-8")

    return publish(output, overwrite, flag, write)


def _normal_modes(directory: str) -> None:
    """Give the files in ``directory`` the mode open() gives a new file (0o666 less the umask, read
    from a probe file: changing the umask to read it would race other threads); safetensors writes
    its files private (0o600)."""
    probe = os.path.join(directory, ".mode-probe")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = os.stat(probe).st_mode & 0o777
    os.unlink(probe)
    for root, _, files in os.walk(directory):
        for name in files:
            os.chmod(os.path.join(root, name), mode)


def publish(output: str | Path, overwrite: bool, flag: str, write) -> Path:
    """``write(tmp)`` into a temporary directory beside ``output`` that then replaces ``output`` whole.
    A write the filesystem refuses is a RunStopped (one line: ``flag``, the directory, the reason), and
    ``output`` is left as it was."""
    output = Path(output).expanduser().absolute()
    check_output(output, overwrite, flag)
    existed = output.exists()
    tmp = None
    try:
        remove_stale_directories(output)
        tmp = temporary_directory(output)
        write(Path(tmp))
        _normal_modes(tmp)
        replace_directory(tmp, output)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        cause = os_error(e) if isinstance(e, Exception) else None
        if cause is None:
            raise
        kept = "its previous content is kept" if existed else "nothing was written"
        raise RunStopped(f"{flag} {output}: cannot be written: {cause.strerror or cause} ({kept})") from e
    return output

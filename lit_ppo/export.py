"""Export: a trained policy as a Hugging Face model directory that transformers and vLLM load.

``python -m lit_ppo export --ckpt_path CKPT --output DIR [--adapter ADAPTER_DIR] [--overwrite]`` reads
a LitPPO checkpoint (verified as for resuming: readable, digest, finite), rebuilds the policy from the
model config in its hyperparameters, loads the checkpoint's policy weights and writes ``DIR`` with the
config, the generation config, ``model.safetensors`` and the tokenizer with the chat template used in
training. ``fit`` writes the same directory at the end of training (``lit_ppo.callbacks.export``).
A LoRA checkpoint (``model.lora_rank`` > 0) is exported with its adapters merged: a plain model that
loads without peft. ``--adapter ADAPTER_DIR`` also writes its adapter alone, in peft's format
(``PeftModel.from_pretrained(base, ADAPTER_DIR)``); with ``--adapter`` only, no merged model is written.

Each directory appears in one rename of a complete temporary directory beside it, so it is never
half written; temporary and set-aside directories that a killed export left beside it are removed
first. Its files get the modes of any new file (0o666 less the umask). An existing non-empty one is
refused unless ``--overwrite`` is given; it is then replaced only once the new export is complete.
Neither directory may be, contain or lie inside what export reads (the checkpoint, the base model
directory or its cache entry), by resolved path: that is refused before any model loads, as is a
place that cannot be written. A write that fails later (a full disk) is one line, exit code 1, and
leaves the directory as it was.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
import warnings
from pathlib import Path

from lit_ppo.cli_errors import ConfigError
from lit_ppo.console import quiet_dependencies
from lit_ppo.errors import RunStopped

USAGE = "usage: python -m lit_ppo export --ckpt_path CKPT [--output DIR] [--adapter ADAPTER_DIR] [--overwrite]"
POLICY_PREFIX = "policy."
"""Prefix of the policy's weights in a LitPPO checkpoint's state_dict."""


def _check_output(output: Path, overwrite: bool, flag: str = "--output") -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{flag} {output}: is a file, must be a directory (new or empty)")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"{flag} {output}: exists and is not empty (give --overwrite to replace it)")


def _check_writable(output: Path, flag: str) -> None:
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


def base_model_paths(cfg) -> dict[str, Path]:
    """What loading the base model of the ModelConfig ``cfg`` reads, ``{description: path}``: a
    local model directory, or the cache entry of a named source."""
    from lit_ppo.models import MODEL_SOURCES, source_cache_entry

    if cfg.source in MODEL_SOURCES:
        return {f"the cache entry of model.source={cfg.source}": source_cache_entry(cfg.source, cfg.cache_dir)}
    return {"the base model directory (model.source)": Path(cfg.source).expanduser()}


def _check_apart(output: Path, flag: str, reads: dict[str, Path]) -> None:
    for what, path in reads.items():
        found = relation(output, path)
        if found is not None:
            raise ConfigError(f"{flag} {output}: {found} {what} {path}, which export reads: "
                              f"give a directory apart from it")


def write_model_dir(model, tokenizer, output: str | Path, overwrite: bool = False, flag: str = "--output") -> Path:
    """Write ``model`` and ``tokenizer`` (with its chat template) to ``output`` atomically; ``flag``
    names it in errors."""
    from transformers import GenerationConfig

    from lit_ppo.models import save_checkpoint

    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    return _publish(output, overwrite, flag, lambda tmp: save_checkpoint(model, tokenizer, tmp))


def write_adapter_dir(policy, output: str | Path, overwrite: bool = False) -> Path:
    """Write the LoRA adapter of ``policy`` to ``output`` atomically, in peft's format."""
    from lit_ppo.lora import save_adapter

    return _publish(output, overwrite, "--adapter", lambda tmp: save_adapter(policy, policy.name_or_path, tmp))


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


def _publish(output: str | Path, overwrite: bool, flag: str, write) -> Path:
    """``write(tmp)`` into a temporary directory beside ``output`` that then replaces ``output`` whole.
    A write the filesystem refuses is a RunStopped (one line: ``flag``, the directory, the reason), and
    ``output`` is left as it was."""
    from lit_ppo.checkpoints import os_error, remove_stale_directories, replace_directory, temporary_directory

    output = Path(output).expanduser().absolute()
    _check_output(output, overwrite, flag)
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


def _read(ckpt_path: str | Path, adapter: bool):
    """``(model config, policy weights, distributed)`` of a verified LitPPO checkpoint; ConfigError
    (one line) if it cannot be used, or if ``adapter`` and it has no LoRA adapter."""
    from lit_ppo.checkpoints import is_distributed_checkpoint, read_checkpoint
    from lit_ppo.models import MODEL_SOURCES, model_dir_problem
    from lit_ppo.module import ModelConfig

    try:
        checkpoint = read_checkpoint(os.fspath(ckpt_path))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = (checkpoint.get("hyper_parameters") or {}).get("model")
    distributed = is_distributed_checkpoint(ckpt_path)
    state = checkpoint.get("state_dict") or {}
    weights = {k[len(POLICY_PREFIX):]: v for k, v in state.items() if k.startswith(POLICY_PREFIX)}
    if not isinstance(model, dict) or not (weights or distributed):
        raise ConfigError(f"--ckpt_path {ckpt_path}: is not a LitPPO checkpoint with hyperparameters "
                          f"(no model config or no policy weights)")
    cfg = ModelConfig(**model)
    if adapter and not cfg.lora_rank:
        raise ConfigError(f"--adapter: --ckpt_path {ckpt_path} was trained without LoRA (model.lora_rank=0), "
                          f"it has no adapter: give --output only")
    if cfg.source not in MODEL_SOURCES:
        problem = model_dir_problem(cfg.source)
        if problem is not None:
            raise ConfigError(f"--ckpt_path {ckpt_path}: its base model model.source={cfg.source} {problem}")
    return cfg, weights, distributed


def _load(ckpt_path: str | Path, cfg, weights: dict, distributed: bool):
    from lit_ppo.lora import add_lora
    from lit_ppo.models import load_causal_lm, use_chat_template
    from lit_ppo.module import DTYPES

    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, DTYPES[cfg.dtype])
    use_chat_template(tokenizer, cfg.chat_template)
    if cfg.lora_rank:
        add_lora(policy, cfg.lora())
    if distributed:
        _load_shards(ckpt_path, policy)
    else:
        policy.load_state_dict(weights, strict=True)
    return policy.eval(), tokenizer


def policy_of_checkpoint(ckpt_path: str | Path, adapter: bool = False):
    """``(policy, tokenizer)`` of a LitPPO checkpoint: the base model of its ``hyper_parameters``
    (with its LoRA adapters, if it was trained with them) holding the checkpoint's policy weights.
    ConfigError (one line) if it cannot be used, or if ``adapter`` and it has no LoRA adapter."""
    return _load(ckpt_path, *_read(ckpt_path, adapter))


def _load_shards(ckpt_path: str | Path, policy) -> None:
    """Read the policy's weights from the shards of a distributed checkpoint (``trainer=fsdp``) into
    ``policy``, in this one process."""
    import torch.distributed.checkpoint as dcp

    stored = dcp.FileSystemReader(os.fspath(ckpt_path)).read_metadata().state_dict_metadata
    own = policy.state_dict()  # the parameters' own storage: a tied weight fills its aliases
    wanted = {f"{POLICY_PREFIX}{name}": t for name, t in own.items() if f"state_dict.{POLICY_PREFIX}{name}" in stored}
    filled = {t.data_ptr() for t in wanted.values()}
    missing = [name for name, t in own.items() if f"{POLICY_PREFIX}{name}" not in wanted and t.data_ptr() not in filled]
    if missing or not wanted:
        raise ConfigError(f"--ckpt_path {ckpt_path}: its shards hold no policy weight "
                          f"{missing[0] if missing else 'at all'} (a checkpoint of another model?)")
    with warnings.catch_warnings():  # that it reads in one process is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"state_dict": wanted}, checkpoint_id=os.fspath(ckpt_path), no_dist=True)


def export(ckpt_path: str | Path, output: str | Path | None, overwrite: bool = False,
           adapter: str | Path | None = None) -> list[Path]:
    """Export the policy of the checkpoint ``ckpt_path`` to the directory ``output`` (adapters merged)
    and / or its LoRA adapter to ``adapter``; returns the directories written."""
    from lit_ppo.lora import merged_model

    targets = {flag: Path(p).expanduser().absolute() for flag, p in (("--output", output), ("--adapter", adapter))
               if p is not None}
    if not targets:
        raise ConfigError(f"give --output DIR (the model) and / or --adapter DIR (its LoRA adapter) "
                          f"({USAGE.removeprefix('usage: ')})")
    if len(set(targets.values())) < len(targets):
        raise ConfigError(f"--adapter {adapter}: must be another directory than --output {output}")
    cfg, weights, distributed = _read(ckpt_path, adapter=adapter is not None)
    reads = {"the checkpoint": Path(ckpt_path), **base_model_paths(cfg)}
    for flag, path in targets.items():  # before any model loads; --overwrite cannot lift the first
        _check_apart(path, flag, reads)
        _check_output(path, overwrite, flag)
        _check_writable(path, flag)
    policy, tokenizer = _load(ckpt_path, cfg, weights, distributed)
    written = []
    if output is not None:
        written.append(write_model_dir(merged_model(policy), tokenizer, output, overwrite))
    if adapter is not None:
        written.append(write_adapter_dir(policy, adapter, overwrite))
    return written


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} ({USAGE.removeprefix('usage: ')})")


def main(argv: list[str]) -> int:
    """``export`` subcommand; returns the exit code (2 for bad input, 1 for a failed write, each with a
    one-line message)."""
    parser = _Parser(prog="python -m lit_ppo export", add_help=False)
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--output")
    parser.add_argument("--adapter")
    parser.add_argument("--overwrite", action="store_true")
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        args = parser.parse_args(argv)
        quiet_dependencies()  # the error line, if any, is all that stderr shows
        paths = export(args.ckpt_path, args.output, args.overwrite, args.adapter)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"exported {args.ckpt_path} to {' and '.join(map(str, paths))}")
    return 0

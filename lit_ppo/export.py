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
half written. An existing non-empty one is refused unless ``--overwrite`` is given; it is then
replaced only once the new export is complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from lit_ppo.cli_errors import ConfigError

USAGE = "usage: python -m lit_ppo export --ckpt_path CKPT [--output DIR] [--adapter ADAPTER_DIR] [--overwrite]"
POLICY_PREFIX = "policy."
"""Prefix of the policy's weights in a LitPPO checkpoint's state_dict."""


def _check_output(output: Path, overwrite: bool, flag: str = "--output") -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{flag} {output}: is a file, must be a directory (new or empty)")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"{flag} {output}: exists and is not empty (give --overwrite to replace it)")


def write_model_dir(model, tokenizer, output: str | Path, overwrite: bool = False) -> Path:
    """Write ``model`` and ``tokenizer`` (with its chat template) to ``output`` atomically."""
    from transformers import GenerationConfig

    from lit_ppo.models import save_checkpoint

    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    return _publish(output, overwrite, "--output", lambda tmp: save_checkpoint(model, tokenizer, tmp))


def write_adapter_dir(policy, output: str | Path, overwrite: bool = False) -> Path:
    """Write the LoRA adapter of ``policy`` to ``output`` atomically, in peft's format."""
    from lit_ppo.lora import save_adapter

    return _publish(output, overwrite, "--adapter", lambda tmp: save_adapter(policy, policy.name_or_path, tmp))


def _publish(output: str | Path, overwrite: bool, flag: str, write) -> Path:
    """``write(tmp)`` into a temporary directory beside ``output``, then rename it onto ``output``."""
    output = Path(output).expanduser().absolute()
    _check_output(output, overwrite, flag)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    old = None
    try:
        tmp.chmod(0o755)
        write(tmp)
        if output.is_dir() and any(output.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            output.rename(old / output.name)
        os.replace(tmp, output)  # onto a missing or empty directory
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not output.exists():
            (old / output.name).rename(output)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return output


def policy_of_checkpoint(ckpt_path: str | Path, adapter: bool = False):
    """``(policy, tokenizer)`` of a LitPPO checkpoint: the base model of its ``hyper_parameters``
    (with its LoRA adapters, if it was trained with them) holding the checkpoint's policy weights.
    ConfigError (one line) if it cannot be used, or if ``adapter`` and it has no LoRA adapter."""
    from lit_ppo.checkpoints import is_distributed_checkpoint, read_checkpoint
    from lit_ppo.lora import add_lora
    from lit_ppo.models import MODEL_SOURCES, load_causal_lm, model_dir_problem, use_chat_template
    from lit_ppo.module import DTYPES, ModelConfig

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
    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, DTYPES[cfg.dtype])
    use_chat_template(tokenizer, cfg.chat_template)
    if cfg.lora_rank:
        add_lora(policy, cfg.lora())
    if distributed:
        _load_shards(ckpt_path, policy)
    else:
        policy.load_state_dict(weights, strict=True)
    return policy.eval(), tokenizer


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
    for flag, path in targets.items():  # before any model loads
        _check_output(path, overwrite, flag)
    policy, tokenizer = policy_of_checkpoint(ckpt_path, adapter=adapter is not None)
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
    """``export`` subcommand; returns the exit code (2 for bad input, with a one-line message)."""
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
        paths = export(args.ckpt_path, args.output, args.overwrite, args.adapter)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt_path} to {' and '.join(map(str, paths))}")
    return 0

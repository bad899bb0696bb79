"""Export: a trained policy as a Hugging Face model directory that transformers and vLLM load.

``python -m lit_ppo export --ckpt_path CKPT --output DIR [--overwrite]`` reads a LitPPO checkpoint
(verified as for resuming: readable, digest, finite), rebuilds the policy from the model config in
its hyperparameters, loads the checkpoint's policy weights and writes ``DIR`` with the config, the
generation config, ``model.safetensors`` and the tokenizer with the chat template used in training.
``fit`` writes the same directory at the end of training (``lit_ppo.callbacks.export``).

``DIR`` appears in one rename of a complete temporary directory beside it, so it is never half
written. An existing non-empty ``DIR`` is refused unless ``--overwrite`` is given; it is then
replaced only once the new export is complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from lit_ppo.cli_errors import ConfigError

USAGE = "usage: python -m lit_ppo export --ckpt_path CKPT --output DIR [--overwrite]"
POLICY_PREFIX = "policy."
"""Prefix of the policy's weights in a LitPPO checkpoint's state_dict."""


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output}: is a file, must be a directory (new or empty)")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"--output {output}: exists and is not empty (give --overwrite to replace it)")


def write_model_dir(model, tokenizer, output: str | Path, overwrite: bool = False) -> Path:
    """Write ``model`` and ``tokenizer`` (with its chat template) to ``output`` atomically."""
    from transformers import GenerationConfig

    from lit_ppo.models import save_checkpoint

    output = Path(output).expanduser().absolute()
    _check_output(output, overwrite)
    output.parent.mkdir(parents=True, exist_ok=True)
    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    old = None
    try:
        tmp.chmod(0o755)
        save_checkpoint(model, tokenizer, tmp)
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


def policy_of_checkpoint(ckpt_path: str | Path):
    """``(policy, tokenizer)`` of a LitPPO checkpoint: the base model of its ``hyper_parameters``
    with the checkpoint's policy weights. ConfigError (one line) if it cannot be used."""
    from lit_ppo.checkpoints import read_checkpoint
    from lit_ppo.models import MODEL_SOURCES, load_causal_lm, model_dir_problem, use_chat_template
    from lit_ppo.module import DTYPES, ModelConfig

    try:
        checkpoint = read_checkpoint(os.fspath(ckpt_path))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = (checkpoint.get("hyper_parameters") or {}).get("model")
    state = checkpoint.get("state_dict") or {}
    weights = {k[len(POLICY_PREFIX):]: v for k, v in state.items() if k.startswith(POLICY_PREFIX)}
    if not isinstance(model, dict) or not weights:
        raise ConfigError(f"--ckpt_path {ckpt_path}: is not a LitPPO checkpoint with hyperparameters "
                          f"(no model config or no policy weights)")
    cfg = ModelConfig(**model)
    if cfg.source not in MODEL_SOURCES:
        problem = model_dir_problem(cfg.source)
        if problem is not None:
            raise ConfigError(f"--ckpt_path {ckpt_path}: its base model model.source={cfg.source} {problem}")
    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, DTYPES[cfg.dtype])
    use_chat_template(tokenizer, cfg.chat_template)
    policy.load_state_dict(weights, strict=True)
    return policy.eval(), tokenizer


def export(ckpt_path: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Export the policy of the checkpoint ``ckpt_path`` to the directory ``output``; returns it."""
    _check_output(Path(output).expanduser().absolute(), overwrite)  # before any model loads
    policy, tokenizer = policy_of_checkpoint(ckpt_path)
    return write_model_dir(policy, tokenizer, output, overwrite)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(f"{message} ({USAGE.removeprefix('usage: ')})")


def main(argv: list[str]) -> int:
    """``export`` subcommand; returns the exit code (2 for bad input, with a one-line message)."""
    parser = _Parser(prog="python -m lit_ppo export", add_help=False)
    parser.add_argument("--ckpt_path", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--overwrite", action="store_true")
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        args = parser.parse_args(argv)
        path = export(args.ckpt_path, args.output, args.overwrite)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt_path} to {path}")
    return 0

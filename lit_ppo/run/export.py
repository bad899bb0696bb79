"""Export: a trained policy as a Hugging Face model directory that transformers and vLLM load.

``export(ckpt_path, output)`` reads a LitPPO checkpoint (verified as for resuming: readable, digest,
finite), rebuilds the policy from the model config in its hyperparameters, loads the checkpoint's
policy weights and writes ``output`` with the config, the generation config, ``model.safetensors`` and
the tokenizer with the chat template used in training (``lit_ppo.models.hf_dir.write_model_dir``).
``fit`` writes the same directory at the end of training (``lit_ppo.callbacks.export``); ``sft``'s checkpoints
export the same way. An rm checkpoint exports its reward model as its run's ``model/`` holds it
(``lit_ppo.run.reward_model_export``: a sequence classifier and its reward statistics). A LoRA
checkpoint (``model.lora_rank`` > 0) is exported with its adapters merged: a plain model that loads
without peft; ``adapter`` also writes its adapter alone, in peft's format
(``PeftModel.from_pretrained(base, ADAPTER_DIR)``). Neither directory may be, contain or lie inside
what export reads (the checkpoint, the base model directory or its cache entry), by resolved path;
nor be or lie inside a run directory (its ``model/`` is its fit's), nor replace a directory that holds
a run or an MLflow tracking store, the working directory or one above it, or the home directory: all
refused before any model loads, as is a place that cannot be written. An existing directory is
replaced by exchanging it with the new one in one step (``lit_ppo.utils.fs.replace_directory``): a
model directory stands at ``--output`` at every instant, and a kill at any point leaves the old or the
new model there whole, and at most a temporary directory that the next export removes. Where the
filesystem cannot exchange (not Linux, or NFS and the like: ``lit_ppo.utils.exchange``), it is replaced
by two renames; an export killed between them leaves the old one set aside, and the next export puts
it back before anything else.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp

from lit_ppo.config import ModelConfig
from lit_ppo.config.model import REWARD_STATISTICS
from lit_ppo.config.rm import RM_ALGO
from lit_ppo.errors import ConfigError
from lit_ppo.models import (
    MODEL_SOURCES,
    base_model_paths,
    load_causal_lm,
    model_dir_problem,
    torch_dtype,
    use_chat_template,
)
from lit_ppo.models.hf_dir import check_apart, check_output, check_writable, write_model_dir
from lit_ppo.models.lora import add_lora, lora_config, merged_model, write_adapter_dir
from lit_ppo.models.reward_model import merged_reward_model
from lit_ppo.run.mlflow_store import resolve_tracking_uri, sqlite_file
from lit_ppo.run.reward_model_export import (
    REWARD_MODEL_PREFIX,
    reward_model_of_checkpoint,
    statistics_over,
    training_pairs,
)
from lit_ppo.training.checkpoint_files import is_distributed_checkpoint, read_checkpoint
from lit_ppo.utils.fs import restore_interrupted

POLICY_PREFIX = "policy."
"""Prefix of the policy's weights in a LitPPO checkpoint's state_dict."""
TRACKING_STORES = ("mlflow.db", "mlruns")
"""The default MLflow stores: a sqlite database file and a file store directory."""


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` is a run's directory: a fit wrote its ``config.yaml`` and ``checkpoints/`` there."""
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def _never_replaced(output: Path) -> str | None:
    """Why export must not write the directory ``output`` whatever ``--overwrite`` says (how it relates
    to a run, a tracking store, the working or home directory), or None."""
    spellings = dict.fromkeys([output, Path(os.path.realpath(output))])
    for spelled in spellings:
        for directory in (spelled, *spelled.parents):
            if is_run_directory(directory):
                how = "is" if directory == spelled else "is inside"
                return f"{how} the run directory {directory}, whose files its fit writes"
    if not output.is_dir():
        return None
    for spelled in spellings:
        for what, place in (("the working directory", Path.cwd()), ("the home directory", Path.home())):
            if spelled == place:
                return f"is {what}"
            if place.is_relative_to(spelled):
                return f"holds {what} {place}"
    store = sqlite_file(resolve_tracking_uri(None))
    if store and Path(os.path.realpath(store)).is_relative_to(os.path.realpath(output)):
        return f"holds the MLflow tracking store {store}"
    for root, directories, files in os.walk(output):
        for name in TRACKING_STORES:
            if name in files or name in directories:
                return f"holds the MLflow tracking store {os.path.join(root, name)}"
        if is_run_directory(Path(root)):
            return f"holds the run directory {root}"
    return None


def check_replaceable(output: Path, flag: str) -> None:
    """ConfigError (one line) if export must never write ``output`` (``_never_replaced``)."""
    reason = _never_replaced(output)
    if reason is not None:
        raise ConfigError(f"{flag} {output}: {reason}; export never writes there, with or without --overwrite: "
                          f"give a new directory apart from it")


def _read(ckpt_path: str | Path, adapter: bool):
    """``(model config, model weights, distributed, the checkpoint)`` of a verified LitPPO, LitSFT or LitRM
    checkpoint (the weights of its policy, or of an rm checkpoint its reward model); ConfigError (one line) if it
    cannot be used, or if ``adapter`` and it has no LoRA adapter."""
    try:
        checkpoint = read_checkpoint(os.fspath(ckpt_path))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    model = hyper_parameters.get("model")
    prefix = REWARD_MODEL_PREFIX if _is_reward_model(checkpoint) else POLICY_PREFIX
    distributed = is_distributed_checkpoint(ckpt_path)
    state = checkpoint.get("state_dict") or {}
    weights = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not isinstance(model, dict) or not (weights or distributed):
        raise ConfigError(f"--ckpt_path {ckpt_path}: is not a LitPPO checkpoint with hyperparameters "
                          f"(no model config or no policy weights)")
    cfg = ModelConfig(**model)
    if adapter and prefix == REWARD_MODEL_PREFIX:
        raise ConfigError(f"--adapter: --ckpt_path {ckpt_path} holds a reward model (rm), whose new scalar head "
                          f"trains beside the adapters and is no part of a peft adapter: give --output only")
    if adapter and not cfg.lora_rank:
        raise ConfigError(f"--adapter: --ckpt_path {ckpt_path} was trained without LoRA (model.lora_rank=0), "
                          f"it has no adapter: give --output only")
    if cfg.source not in MODEL_SOURCES:
        problem = model_dir_problem(cfg.source)
        if problem is not None:
            raise ConfigError(f"--ckpt_path {ckpt_path}: its base model model.source={cfg.source} {problem}")
    return cfg, weights, distributed, checkpoint


def _is_reward_model(checkpoint: dict) -> bool:
    """Whether ``checkpoint`` was written by ``python -m lit_ppo rm`` (its weights a reward model's)."""
    return (checkpoint.get("hyper_parameters") or {}).get("algo") == RM_ALGO


def _load(ckpt_path: str | Path, cfg, weights: dict, distributed: bool, checkpoint: dict):
    if _is_reward_model(checkpoint):
        def fill(model) -> None:
            if distributed:
                _load_shards(ckpt_path, model, REWARD_MODEL_PREFIX)
            else:
                model.load_state_dict(weights, strict=True)

        return reward_model_of_checkpoint(cfg, fill)
    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, torch_dtype(cfg.dtype))
    use_chat_template(tokenizer, cfg.chat_template)
    if cfg.lora_rank:
        add_lora(policy, lora_config(cfg))
    if distributed:
        _load_shards(ckpt_path, policy, POLICY_PREFIX)
    else:
        policy.load_state_dict(weights, strict=True)
    return policy.eval(), tokenizer


def policy_of_checkpoint(ckpt_path: str | Path, adapter: bool = False):
    """``(policy, tokenizer)`` of a LitPPO checkpoint: the base model of its ``hyper_parameters``
    (with its LoRA adapters, if it was trained with them) holding the checkpoint's policy weights.
    ConfigError (one line) if it cannot be used, or if ``adapter`` and it has no LoRA adapter."""
    return _load(ckpt_path, *_read(ckpt_path, adapter))


def _load_shards(ckpt_path: str | Path, policy, prefix: str) -> None:
    """Read the weights stored under ``prefix`` (the policy's, a reward model's) from the shards of a distributed
    checkpoint (``trainer=fsdp``) into ``policy``, in this one process."""
    stored = dcp.FileSystemReader(os.fspath(ckpt_path)).read_metadata().state_dict_metadata
    own = policy.state_dict()  # the parameters' own storage: a tied weight fills its aliases
    wanted = {f"{prefix}{name}": t for name, t in own.items() if f"state_dict.{prefix}{name}" in stored}
    filled = {t.data_ptr() for t in wanted.values()}
    missing = [name for name, t in own.items() if f"{prefix}{name}" not in wanted and t.data_ptr() not in filled]
    if missing or not wanted:
        raise ConfigError(f"--ckpt_path {ckpt_path}: its shards hold no policy weight "
                          f"{missing[0] if missing else 'at all'} (a checkpoint of another model?)")
    with warnings.catch_warnings():  # that it reads in one process is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"state_dict": wanted}, checkpoint_id=os.fspath(ckpt_path), no_dist=True)


def export(ckpt_path: str | Path, output: str | Path | None, overwrite: bool = False,
           adapter: str | Path | None = None) -> list[Path]:
    """Export the policy of the checkpoint ``ckpt_path`` (of an rm checkpoint its reward model, with its reward
    statistics) to the directory ``output`` (adapters merged) and / or its LoRA adapter to ``adapter``; returns
    the directories written."""
    targets = {flag: Path(p).expanduser().absolute() for flag, p in (("--output", output), ("--adapter", adapter))
               if p is not None}
    if not targets:
        raise ConfigError("give --output DIR (the model) and / or --adapter DIR (its LoRA adapter)")
    if len(set(targets.values())) < len(targets):
        raise ConfigError(f"--adapter {adapter}: must be another directory than --output {output}")
    cfg, weights, distributed, checkpoint = _read(ckpt_path, adapter=adapter is not None)
    pairs = training_pairs(os.fspath(ckpt_path), checkpoint) if _is_reward_model(checkpoint) else None
    reads = {"the checkpoint": Path(ckpt_path), **base_model_paths(cfg)}
    for flag, path in targets.items():  # before any model loads; --overwrite cannot lift the first two
        restored = restore_interrupted(path)
        if restored is not None:
            print(f"note: {flag} {path}: an export was cut short while replacing it; its previous content is "
                  f"back from {restored}", file=sys.stderr, flush=True)
        check_apart(path, flag, reads)
        check_replaceable(path, flag)
        check_output(path, overwrite, flag)
        check_writable(path, flag)
    policy, tokenizer = _load(ckpt_path, cfg, weights, distributed, checkpoint)
    written = []
    if pairs is not None:
        record = {REWARD_STATISTICS: statistics_over(pairs, policy, tokenizer)}
        written.append(write_model_dir(merged_reward_model(policy), tokenizer, output, overwrite, source=cfg.source,
                                       record=record))
    elif output is not None:
        written.append(write_model_dir(merged_model(policy), tokenizer, output, overwrite, source=cfg.source))
    if adapter is not None:
        written.append(write_adapter_dir(policy, adapter, overwrite))
    return written



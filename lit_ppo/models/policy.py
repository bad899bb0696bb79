"""The policy that every job trains, loaded from the ``model`` section (``ModelConfig``): the causal LM of
``model.source`` in ``model.dtype``, in training mode, with gradient checkpointing where asked, and its
tokenizer with ``model.chat_template``. LoRA adapters are the caller's to add: ``LitPPO`` copies its
critic from the policy first, which gets adapters of its own."""

from __future__ import annotations

from lit_ppo.config import ModelConfig
from lit_ppo.models.chat import use_chat_template
from lit_ppo.models.sources import load_causal_lm, load_tokenizer, torch_dtype


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

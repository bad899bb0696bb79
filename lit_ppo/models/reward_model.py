"""A reward model made from a causal LM: the sequence classifier of the LM's architecture
(``AutoModelForSequenceClassification``, one label, as TRL's RewardTrainer makes it) holding the LM's body
and a fresh scalar head (``score``), so that the directory it is written to is what ``reward_fns`` and plain
transformers load. Its reward for a text is the head's output at the text's last token."""

from __future__ import annotations

import copy

import torch

from lit_ppo.models.attention import use_float32_attention_on_cpu
from lit_ppo.models.cpu_matmul import use_onednn_linears
from lit_ppo.models.lora import has_lora, merged_weights


def reward_model_from(policy, tokenizer):
    """The sequence classifier of ``policy``'s config with one label, its body holding ``policy``'s body
    weights and its head initialised as transformers initialises it (from the global RNG: seeded runs are
    reproducible); its ``pad_token_id`` is ``tokenizer``'s, by which it finds each row's last token."""
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config, dtype=next(policy.parameters()).dtype)
    model.base_model.load_state_dict(policy.base_model.state_dict())
    use_float32_attention_on_cpu(model)
    return use_onednn_linears(model).train(policy.training)


def merged_reward_model(model):
    """``model`` itself without LoRA adapters, else a plain sequence classifier of its config holding its
    weights with the adapters merged (``model`` is unchanged): what the export writes."""
    from transformers import AutoModelForSequenceClassification

    if not has_lora(model):
        return model
    plain = AutoModelForSequenceClassification.from_config(model.config, dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        plain.load_state_dict(dict(merged_weights(model)), strict=True)
    return plain.eval()


def rewards(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The reward of each right-padded row, ``[B]`` float32: the model's one logit at the row's last token, as
    transformers computes it (and as ``reward_fns`` scores a text)."""
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, 0].float()

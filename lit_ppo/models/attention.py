"""Attention in float32 under CPU autocast: the attention implementation ``sdpa_float32_on_cpu``.

Under ``trainer.precision=bf16-mixed`` autocast runs ``scaled_dot_product_attention`` in bfloat16,
and on CPU its bfloat16 kernels are slower than the float32 ones at the shapes of RL training
(measured on one thread: a decoding step's attention over 16 rows of 100 tokens 1.4 ms against
0.2 ms; a forward and backward pass over 12 rows of 100 tokens 37 ms against 19 ms). This
implementation computes softmax(Q K^T) V itself in float32 on CPU under autocast, and is
transformers' ``sdpa`` everywhere else (on GPU, or without autocast). The projections around it
keep autocast's dtype; the rounding is less, not more, than bfloat16 attention's. The policy, its
reference and critic copies and the HF engine's copy all use it, so the engine samples what the
trainer recomputes.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_float32_on_cpu"


def float32_on_cpu_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention, with the attention itself in float32 on CPU under autocast."""
    device = query.device.type
    if device != "cpu" or not torch.is_autocast_enabled(device):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    with torch.autocast(device, enabled=False):
        return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)


AttentionInterface.register(NAME, float32_on_cpu_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_float32_attention_on_cpu(model: torch.nn.Module) -> None:
    """Switch a transformers model on ``sdpa`` attention to ``NAME`` (other implementations stay)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)

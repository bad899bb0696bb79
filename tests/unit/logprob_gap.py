"""How far the trainer's log-probs of an engine's samples lie from the behaviour log-probs the engine
reported: shared by the tests of the HF engine in bfloat16 and of the float32 attention on CPU."""

from __future__ import annotations

import torch

from lit_ppo.models import token_logprobs


def engine_batch(prompts, out):
    """The engine's completions as a padded batch: input ids, masks, behaviour log-probs."""
    rows = [(p, c) for p, cs in zip(prompts, out) for c in cs]
    width = max(len(p) + len(c.token_ids) for p, c in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    loss_mask = torch.zeros_like(attention_mask)
    behave = torch.zeros(len(rows), width)
    for i, (p, c) in enumerate(rows):
        n = len(p) + len(c.token_ids)
        input_ids[i, :n] = torch.tensor(p + c.token_ids)
        attention_mask[i, :n] = True
        loss_mask[i, len(p):n] = True
        behave[i, len(p):n] = torch.tensor(c.logprobs)
    return input_ids, attention_mask, loss_mask, behave


def gap(model, prompts, out, bf16: bool) -> float:
    input_ids, attention_mask, loss_mask, behave = engine_batch(prompts, out)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = token_logprobs(model, input_ids, attention_mask, loss_mask=loss_mask)
    return float((logp - behave).abs()[loss_mask].mean())

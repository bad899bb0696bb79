"""The sampling distribution, shared by the rollout engines and the trainer.

Engines sample from it and report the log-prob of each sampled token under it; the trainer
recomputes log-probs under the very same transformation of its own logits, so importance ratios
compare like with like (temperature, top-k / top-p support, allowed-token restriction).
Order: allowed-token restriction, temperature, top-k, top-p (vLLM's and transformers' order).
"""

from __future__ import annotations

import torch


def allowed_mask(allowed_token_ids: list[int] | torch.Tensor | None, vocab_size: int,
                 device: torch.device | str) -> torch.Tensor | None:
    """Bool ``[V]`` of the allowed tokens, or None for no restriction."""
    if allowed_token_ids is None:
        return None
    ids = torch.as_tensor(allowed_token_ids, dtype=torch.long, device=device)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"allowed_token_ids must be non-empty ids in [0, {vocab_size}), got {ids.tolist()}")
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[ids] = True
    return mask


def sampling_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[..., V]`` of the sampling distribution: float32, -inf outside its support.

    ``allowed`` is a bool ``[V]`` mask (see ``allowed_mask``). top-p keeps the smallest set of most
    likely tokens whose probability reaches ``top_p`` (always at least one token). Temperature 0 is
    greedy decoding: all mass on the most likely allowed token (the first of equals).
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} is invalid: must be > 0 (or 0 for greedy decoding)")
    out = logits.float()
    if allowed is not None:
        out = out.masked_fill(~allowed, -torch.inf)
    if temperature == 0:
        best = out.argmax(-1, keepdim=True)
        return torch.full_like(out, -torch.inf).scatter(-1, best, 0.0)
    if temperature != 1.0:
        out = out / temperature
    if top_k and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, -torch.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, -torch.inf)
    return out


def sampling_logprobs(logits: torch.Tensor, tokens: torch.Tensor, **params) -> torch.Tensor:
    """log p(tokens) under the sampling distribution of ``logits`` (``[..., V]`` and ``[...]``)."""
    return sampling_logits(logits, **params).log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

"""Reductions over the masked tokens of label-aligned ``[B, T]`` tensors: a statistic's mean, a row's mean
put back on its tokens, and the policy loss's aggregation modes (docs/algorithms.md#loss-aggregation)."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the masked tokens, in float32; 0 when none is."""
    return (x.float() * mask).sum() / mask.sum().clamp(min=1)


def sequence_broadcast(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row masked mean of x, placed on the row's masked tokens (0 elsewhere)."""
    mean = (x * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    return mean * mask


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, num_tokens: float | None,
              num_seqs: float | None, max_new_tokens: int, row_tokens: torch.Tensor) -> torch.Tensor:
    """Reduce ``[B, T]`` losses to a scalar; ``num_tokens`` / ``num_seqs`` are global counts so that
    micro-batch losses add up to the minibatch loss. ``row_tokens`` = |o_i| per row."""
    masked = per_token * mask
    if mode == "token-mean":
        n = row_tokens.sum() if num_tokens is None else num_tokens
        return masked.sum() / max(float(n), 1.0)
    n_seqs = float((row_tokens > 0).sum()) if num_seqs is None else float(num_seqs)
    n_seqs = max(n_seqs, 1.0)
    row_sums = masked.sum(1)
    if mode == "seq-mean-token-mean":
        return (row_sums / row_tokens.clamp(min=1)).sum() / n_seqs
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / n_seqs
    if mode == "seq-mean-token-sum-norm":
        return row_sums.sum() / (n_seqs * max_new_tokens)
    raise ValueError(f"loss_agg_mode={mode!r} is invalid")

"""Reward shaping of the scalar outcome reward per row, before normalisation (docs/algorithms.md#reward-shaping)."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, *, max_new_tokens: int, overlong_tokens: int,
                     factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment, one value <= 0 per row.

    0 while L <= L_max - L_ov, then falling linearly to -factor at L = L_max (no floor beyond):
    min(-(L - (L_max - L_ov)) / L_ov * factor, 0), with L the number of generated tokens.
    """
    if overlong_tokens <= 0 or overlong_tokens > max_new_tokens:
        raise ValueError(
            f"overlong_tokens={overlong_tokens} is invalid: must be in [1, max_new_tokens={max_new_tokens}]")
    excess = lengths.float() - (max_new_tokens - overlong_tokens)
    return torch.clamp(-excess / overlong_tokens * factor, max=0.0)


def shape_rewards(rewards: torch.Tensor, *, bias: float, scaling: float, clip: float) -> torch.Tensor:
    """clip((R + bias) * scaling, -clip, clip): bias first, clip after scaling."""
    return torch.clamp((rewards.float() + bias) * scaling, -clip, clip)

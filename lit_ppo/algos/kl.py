"""KL estimators between the policy and a base policy, per sampled token (Schulman's k1/k2/k3)."""

from __future__ import annotations

import torch

KL_REWARD_CLAMP = 10.0
"""Bound of each token's KL estimate in the reward, against exploding penalties on rare tokens."""


def kl_estimate(logp: torch.Tensor, base_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Estimate of KL(pi || pi_base) from tokens sampled by pi, with delta = log pi - log pi_base.

    k1 = delta (unbiased, signed); k2 = delta^2 / 2; k3 = exp(-delta) - 1 + delta (unbiased, >= 0).
    Unclamped, float32.
    """
    delta = logp.float() - base_logp.float()
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta.square()
    if estimator == "k3":
        return torch.expm1(-delta) + delta
    raise ValueError(f"kl_estimator={estimator!r} is invalid: must be one of 'k1', 'k2', 'k3'")


def kl_reward(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, *, kl_ctl: float,
              estimator: str) -> torch.Tensor:
    """Per-token KL penalty added to the reward: -kl_ctl * clamp(K, -10, 10) on generated tokens."""
    kl = kl_estimate(logp, ref_logp, estimator).clamp(-KL_REWARD_CLAMP, KL_REWARD_CLAMP)
    return -kl_ctl * kl * mask.float()

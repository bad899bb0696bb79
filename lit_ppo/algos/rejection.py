"""Rejection sampling of off-policy tokens: IcePop, KPop and weight clamping (docs/algorithms.md#rejection-sampling).

The behaviour importance weight w_t = pi_prox / pi_behave corrects for the gap between the policy
that sampled a token (the inference engine, possibly stale) and the proximal policy the loss is
taken against. Tokens or whole sequences whose mismatch metric leaves [lower, upper] are dropped
from the loss (``mask``) or get their weight truncated (``clamp``).
"""

from __future__ import annotations

import torch

from lit_ppo.algos.kl import kl_estimate
from lit_ppo.config import RejectionSamplingConfig

_PROB_EPS = 1e-8


def bernoulli_kl(logp: torch.Tensor, base_logp: torch.Tensor) -> torch.Tensor:
    """KL(Bern(p) || Bern(q)) of 'this token' vs 'any other token', p = exp(logp), q = exp(base_logp).
    float64 inside: 1 - 1e-8 is 1 in float32."""
    p = logp.double().exp().clamp(_PROB_EPS, 1 - _PROB_EPS)
    q = base_logp.double().exp().clamp(_PROB_EPS, 1 - _PROB_EPS)
    return (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).nan_to_num(0.0).float()


def binary_kl(logp: torch.Tensor, base_logp: torch.Tensor) -> torch.Tensor:
    """KPop metric: the symmetric (max of both directions) ``bernoulli_kl`` of the two policies."""
    return torch.maximum(bernoulli_kl(logp, base_logp), bernoulli_kl(base_logp, logp))


def _token_metric(metric: str, log_w: torch.Tensor, prox_logp: torch.Tensor,
                  behave_logp: torch.Tensor) -> torch.Tensor:
    if metric == "ratio":
        return log_w.exp()
    if metric == "binary_kl":
        return binary_kl(prox_logp, behave_logp)
    return kl_estimate(log_w, torch.zeros_like(log_w), metric.removeprefix("kl_"))


def _sequence_aggregate(values: torch.Tensor, mask: torch.Tensor, agg: str) -> torch.Tensor:
    count = mask.sum(1)
    if agg == "max":
        top = torch.where(mask, values, -torch.inf).max(1).values
        return torch.where(count > 0, top, 0.0)  # a row with no valid token counts as in bounds
    total = (values * mask).sum(1)
    return total if agg == "sum" else total / count.clamp(min=1)


def rejection_sampling(prox_logp: torch.Tensor, behave_logp: torch.Tensor, mask: torch.Tensor,
                       cfg: RejectionSamplingConfig) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Bound the behaviour weight on ``[B, T]`` label-aligned tokens.

    Returns the narrowed loss mask, the weight w (0 where the returned mask is 0; at sequence level
    with metric 'ratio' it is the sequence's geometric mean weight) and detached statistics.
    """
    if prox_logp.dim() != 2 or behave_logp.shape != prox_logp.shape or mask.shape != prox_logp.shape:
        raise ValueError(f"prox_logp, behave_logp and mask must share one [B, T] shape, got "
                         f"{tuple(prox_logp.shape)}, {tuple(behave_logp.shape)}, {tuple(mask.shape)}")
    prox_logp, behave_logp = prox_logp.detach(), behave_logp.detach()
    valid = mask.bool()
    log_w = (prox_logp.float() - behave_logp.float())
    log_w = torch.where(torch.isfinite(log_w), log_w, 0.0)  # -inf - (-inf) must not become NaN
    metric = _token_metric(cfg.metric, log_w, prox_logp, behave_logp)
    weight = log_w.exp()

    def in_bounds(v: torch.Tensor) -> torch.Tensor:
        ok = v <= cfg.upper
        return ok if cfg.lower is None else ok & (v >= cfg.lower)

    def clamped(w: torch.Tensor) -> torch.Tensor:
        return w.clamp(cfg.lower, cfg.upper)

    if cfg.level == "token":
        keep = valid & in_bounds(metric) if cfg.action == "mask" else valid
        new_weight = clamped(weight) if cfg.action == "clamp" else weight
    else:
        per_seq = _sequence_aggregate(log_w if cfg.metric == "ratio" else metric, valid, cfg.agg)
        if cfg.metric == "ratio":
            per_seq = per_seq.exp()
            geometric_mean = _sequence_aggregate(log_w, valid, "mean").exp()
            weight = geometric_mean[:, None].expand_as(weight)
        seq_ok = in_bounds(per_seq)[:, None]
        keep = valid & seq_ok if cfg.action == "mask" else valid
        new_weight = torch.where(seq_ok, weight, clamped(weight)) if cfg.action == "clamp" else weight

    changed = valid & ~keep if cfg.action == "mask" else valid & (new_weight != weight)
    new_weight = torch.where(keep, new_weight, 0.0)
    n_valid = valid.sum().clamp(min=1)
    n_kept = keep.sum().clamp(min=1)
    stats = {
        "filtered_fraction": changed.sum() / n_valid,
        "behave_imp_weight": new_weight.sum() / n_kept,
        "behave_approx_kl": (log_w * keep).sum() / n_kept,
    }
    return keep, new_weight, stats

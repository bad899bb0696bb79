"""Clip-Cov and KL-Cov (arXiv:2505.22617): the few tokens of highest covariance between advantage and
log-prob lose their gradient or get a penalty, which keeps the policy's entropy from collapsing
(docs/algorithms.md#clip-cov-and-kl-cov)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lit_ppo.algos.reduce import masked_mean

if TYPE_CHECKING:
    from lit_ppo.config import ClipCovConfig, KLCovConfig, PPOActorConfig


def covariance_terms(per_token: torch.Tensor, surrogate_stats: dict[str, torch.Tensor], advantages: torch.Tensor,
                     logp: torch.Tensor, log_ratio: torch.Tensor, valid: torch.Tensor, loss_mask: torch.Tensor,
                     cfg: PPOActorConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The surrogate's per-token loss with Clip-Cov's dropped tokens zeroed (among those the surrogate did
    not clip) and KL-Cov's penalty coef |log r_t| added on its chosen ones, and the share of each."""
    stats: dict[str, torch.Tensor] = {}
    if cfg.clip_cov is None and cfg.kl_cov is None:
        return per_token, stats
    cov = token_covariance(advantages, logp, valid)
    if cfg.clip_cov is not None:
        candidates = loss_mask & ~surrogate_stats["clip_fraction"].bool()
        dropped = clip_cov_dropped(cov, candidates, int(valid.sum()), cfg.clip_cov)
        per_token = torch.where(dropped, 0.0, per_token)
        stats["clip_cov_fraction"] = masked_mean(dropped, valid)
    if cfg.kl_cov is not None:
        chosen = kl_cov_chosen(cov, loss_mask, cfg.kl_cov)
        per_token = per_token + cfg.kl_cov.coef * log_ratio.abs() * chosen
        stats["kl_cov_fraction"] = masked_mean(chosen, valid)
    return per_token, stats


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t - mean A) (log pi_theta_t - mean log pi_theta), the means over the valid tokens (detached)."""
    a, lp = advantages.detach().float(), logp.detach().float()
    return (a - masked_mean(a, valid)) * (lp - masked_mean(lp, valid)) * valid


def clip_cov_dropped(cov: torch.Tensor, candidates: torch.Tensor, n_valid: int, cfg: ClipCovConfig) -> torch.Tensor:
    """Clip-Cov: max(floor(ratio * n_valid), 1) tokens drawn at random among ``candidates`` whose covariance
    lies strictly between low and high."""
    pool = (candidates & (cov > cfg.low) & (cov < cfg.high)).flatten().nonzero().squeeze(1)
    count = min(max(int(cfg.ratio * n_valid), 1), pool.numel())
    dropped = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    dropped[pool[torch.randperm(pool.numel(), device=cov.device)[:count]]] = True
    return dropped.view_as(cov)


def kl_cov_chosen(cov: torch.Tensor, valid: torch.Tensor, cfg: KLCovConfig) -> torch.Tensor:
    """KL-Cov: the max(floor(ratio * n_valid), 1) valid tokens of largest covariance."""
    n_valid = int(valid.sum())
    chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    if n_valid:
        ranked = torch.where(valid, cov, -torch.inf).flatten()
        chosen[ranked.topk(max(int(cfg.ratio * n_valid), 1)).indices] = True
    return chosen.view_as(cov)

"""Which generated tokens the policy loss counts, and with what weight (docs/algorithms.md#decoupled-loss,
docs/algorithms.md#m2po-mask, docs/algorithms.md#trust-region-mask, docs/algorithms.md#high-entropy-tokens).

Each mask narrows the loss's numerator only: a masked token still counts in the aggregation's N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lit_ppo.algos.reduce import masked_mean
from lit_ppo.algos.rejection import bernoulli_kl, rejection_sampling

if TYPE_CHECKING:
    from lit_ppo.config import PPOActorConfig, RejectionSamplingConfig, TrustRegionMaskConfig


def token_mask_and_weight(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                          valid: torch.Tensor, cfg: PPOActorConfig, *, behave_logp: torch.Tensor | None,
                          entropy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                 dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tokens whose loss counts, their weight w_t (None: 1), the masks' statistics and the number of tokens
    of each that is a mean over other tokens than the valid ones: the decoupled loss's behaviour weight (bounded
    or masked by rejection sampling; its mean weight and approx. KL over the tokens rejection kept), then M2PO's,
    DPPO's trust-region and the high-entropy masks, each logged as the share of the valid tokens it drops."""
    loss_mask, weight, stats, tokens = valid, None, {}, {}
    if cfg.use_decoupled_loss:
        if behave_logp is None:
            raise ValueError("use_decoupled_loss=true needs behave_logp (the engine's behaviour log-probs)")
        loss_mask, weight, stats = behaviour_weight(old_logp, behave_logp, valid, cfg.rejection_sampling)
        tokens = {name: loss_mask.sum() for name in ("behave_imp_weight", "behave_approx_kl") if name in stats}
    if cfg.m2_threshold is not None:
        kept = m2po_keep(behave_logp, old_logp, valid, cfg.m2_threshold)
        loss_mask, stats["m2po_masked_fraction"] = _narrowed(loss_mask, kept, valid)
    if cfg.trust_region_mask is not None:
        kept = trust_region_keep(logp, old_logp, advantages, cfg.trust_region_mask)
        loss_mask, stats["trust_region_masked_fraction"] = _narrowed(loss_mask, kept, valid)
    if cfg.top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the tokens' entropy")
        kept = high_entropy_keep(entropy, valid, cfg.top_entropy_quantile)
        loss_mask, stats["low_entropy_masked_fraction"] = _narrowed(loss_mask, kept, valid)
    return loss_mask, weight, stats, tokens


def _narrowed(loss_mask: torch.Tensor, kept: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``loss_mask`` without the tokens ``kept`` drops, and the share of the valid tokens it drops."""
    return loss_mask & kept, masked_mean(~kept, valid)


def behaviour_weight(prox_logp: torch.Tensor, behave_logp: torch.Tensor, valid: torch.Tensor,
                     rejection: RejectionSamplingConfig | None
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The decoupled loss's w_t = pi_prox / pi_behave (detached) with the tokens it keeps, by
    ``rejection_sampling`` when configured, else every valid token (a non-finite log-weight counts as 1)."""
    if rejection is not None:
        return rejection_sampling(prox_logp, behave_logp, valid, rejection)
    log_w = prox_logp.float() - behave_logp.detach().float()
    weight = torch.where(valid & torch.isfinite(log_w), log_w, 0.0).exp() * valid
    return valid, weight, {"behave_imp_weight": masked_mean(weight, valid), "filtered_fraction": torch.zeros(())}


def m2po_keep(behave_logp: torch.Tensor, prox_logp: torch.Tensor, valid: torch.Tensor,
              threshold: float) -> torch.Tensor:
    """M2PO's mask (AReaL's form): with m2_t = (log pi_behave - log pi_prox)^2 over the valid tokens sorted
    from the largest, the k largest are dropped, k the first index whose suffix mean is below ``threshold``
    (all but the smallest when none is)."""
    m2 = (behave_logp.detach().float() - prox_logp.detach().float()).square()[valid]
    if m2.numel() == 0:
        return valid
    order = m2.argsort(descending=True)
    suffix_means = m2[order].flip(0).cumsum(0).flip(0) / torch.arange(m2.numel(), 0, -1, device=m2.device)
    below = (suffix_means < threshold).nonzero()
    k = int(below[0]) if below.numel() else m2.numel() - 1
    kept = torch.ones_like(m2, dtype=torch.bool)
    kept[order[:k]] = False
    keep = torch.zeros_like(valid)
    keep[valid] = kept
    return keep


def trust_region_keep(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      cfg: TrustRegionMaskConfig) -> torch.Tensor:
    """DPPO's mask: False where the sampled token's probability p = pi_theta moved from mu = pi_old past the
    bound in the direction its advantage pushes (A > 0 and it rose, A < 0 and it fell), by |p - mu|
    (binary_tv) or KL(Bern(mu) || Bern(p)) (binary_kl)."""
    p, mu = logp.detach().float().exp(), old_logp.detach().float().exp()
    if cfg.divergence == "binary_tv":
        past_high, past_low = p - mu > cfg.high, mu - p > cfg.low
    else:
        divergence = bernoulli_kl(old_logp.detach(), logp.detach())
        past_high, past_low = (p > mu) & (divergence > cfg.high), (p < mu) & (divergence > cfg.low)
    return ~(((advantages > 0) & past_high) | ((advantages < 0) & past_low))


def high_entropy_keep(entropy: torch.Tensor, valid: torch.Tensor, fraction: float) -> torch.Tensor:
    """True for the tokens whose entropy reaches the (1 - fraction) quantile of the valid tokens' entropies
    (linear interpolation, as torch.quantile and TRL)."""
    if not valid.any():
        return valid
    threshold = torch.quantile(entropy.detach().float()[valid], 1.0 - fraction)
    return entropy.detach().float() >= threshold

"""Policy and value losses, label-aligned ``[B, T]`` (docs/algorithms.md#policy-losses,
docs/algorithms.md#value-loss).

``policy_loss`` is the loss's equation in named stages, so PPO, GRPO, GSPO, GMPO, DAPO, SAPO, CISPO, DPPO,
M2PO, IcePop, KPop, Clip-Cov and KL-Cov are one code path: which tokens count and their behaviour weight
(``token_masks``), the ratio, the registered per-token surrogate L_t(r_t, A_t) (``surrogates``), the
covariance terms (``covariance``), the aggregation (``reduce``) and the regularisers.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable

import torch

from lit_ppo.algos.covariance import covariance_terms
from lit_ppo.algos.kl import kl_estimate
from lit_ppo.algos.reduce import aggregate, masked_mean, sequence_broadcast
from lit_ppo.algos.surrogates import POLICY_LOSSES
from lit_ppo.algos.token_masks import token_mask_and_weight

if TYPE_CHECKING:
    from lit_ppo.config import PPOActorConfig

Reduce = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``aggregate`` with the loss's mode and counts bound: (per-token values, mask) -> scalar."""


class LossStats(dict):
    """``policy_loss``'s detached statistics (name -> 0-d tensor), with ``tokens``: for each statistic that is
    a mean, the number of tokens it is a mean over, so that the means of several micro-batches combine
    weighted by it; ``loss`` and ``kl_loss`` have none (each micro-batch's is its share of the minibatch's)."""

    def __init__(self, stats: dict[str, torch.Tensor], tokens: dict[str, torch.Tensor]):
        super().__init__(stats)
        self.tokens = tokens


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                cfg: PPOActorConfig, *, behave_logp: torch.Tensor | None = None,
                num_tokens: float | None = None, num_seqs: float | None = None,
                entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """The policy loss of one micro-batch and its detached statistics (``LossStats``: 0-d tensors, each mean
    with the number of tokens it is over).

    r_t = exp(log pi_theta - log pi_old); pi_old is the proximal policy when ``use_decoupled_loss``,
    and then every token is weighted by w_t = pi_old / pi_behave (detached), bounded or masked by
    ``cfg.rejection_sampling``. With ``importance_sampling_level='sequence'`` (GSPO) r and A are
    replaced by the sequence's s_i = exp(mean_t log r_t) and mean advantage; the gradient flows
    through s_i. Token-mean loss = sum_t L_t / N with N = ``num_tokens`` or the mask count, counted
    before rejection (rejected tokens leave the numerator only). The M2PO, trust-region and entropy masks
    narrow the numerator the same way; Clip-Cov zeroes the loss of a few tokens after the surrogate and
    KL-Cov adds its penalty to a few. ``cfg.kl_loss_coef`` adds beta times the KL estimate to ``ref_logp``,
    aggregated as the loss is. With ``ref_logp``, ``kl_ref`` is TRL's ``kl``: the k3 estimate of
    KL(pi_theta || pi_ref), the mean over the generated tokens.
    """
    _check_shapes(logp, old_logp, advantages, mask)
    valid = mask.bool()
    old_logp, advantages = old_logp.detach(), advantages.detach().float()
    reduce = partial(aggregate, mode=cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_new_tokens=cfg.max_new_tokens, row_tokens=valid.sum(1))

    loss_mask, weight, mask_stats, mask_tokens = token_mask_and_weight(logp, old_logp, advantages, valid, cfg,
                                                                       behave_logp=behave_logp, entropy=entropy)
    counted = loss_mask.float()
    log_ratio, ratio, advantages = importance_ratio(logp, old_logp, advantages, valid, counted, cfg)
    per_token, surrogate_stats = POLICY_LOSSES.get(cfg.policy_loss)(ratio, advantages, cfg)
    per_token, cov_stats = covariance_terms(per_token, surrogate_stats, advantages, logp, log_ratio, valid,
                                            loss_mask, cfg)
    if weight is not None:
        per_token = per_token * weight
    loss = reduce(per_token, counted)
    loss, regulariser_stats = with_regularisers(loss, logp, valid, cfg, reduce, ref_logp=ref_logp, entropy=entropy)
    if ref_logp is not None:
        regulariser_stats["kl_ref"] = masked_mean(kl_estimate(logp.detach(), ref_logp.detach(), "k3"), valid)
    counted_stats = ratio_stats(surrogate_stats, ratio, loss_mask)
    stats = {**mask_stats, **cov_stats, **regulariser_stats, **counted_stats, "loss": loss.detach()}
    # Every other mean is over the generated tokens.
    tokens = {**{name: valid.sum() for name in stats if name not in ("loss", "kl_loss")}, **mask_tokens,
              **{name: loss_mask.sum() for name in counted_stats}}
    return loss, LossStats(stats, tokens)


def _check_shapes(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> None:
    if not (logp.shape == old_logp.shape == advantages.shape == mask.shape) or logp.dim() != 2:
        raise ValueError(f"logp, old_logp, advantages and mask must share one [B, T] shape, got "
                         f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(advantages.shape)}, "
                         f"{tuple(mask.shape)}")


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, valid: torch.Tensor,
                     loss_mask: torch.Tensor, cfg: PPOActorConfig
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token log-ratios log r_t (through the loss's registered transform, GMPO's log-space clip), and the
    ratio and advantages the surrogate takes: the token's r_t and A_t, or at the sequence level the row's
    exp(mean_t log r_t) and mean advantage on each of its counted tokens (GSPO; GMPO's geometric mean)."""
    log_ratio = torch.where(valid, logp.float() - old_logp.float(), 0.0)
    transform = POLICY_LOSSES.log_ratio(cfg.policy_loss)
    if transform is not None:
        log_ratio = transform(log_ratio, advantages, cfg)
    if cfg.importance_sampling_level == "sequence":
        ratio = sequence_broadcast(log_ratio, loss_mask).exp() * loss_mask
        return log_ratio, ratio, sequence_broadcast(advantages, loss_mask)
    return log_ratio, log_ratio.exp(), advantages


def with_regularisers(loss: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor, cfg: PPOActorConfig,
                      reduce: Reduce, *, ref_logp: torch.Tensor | None, entropy: torch.Tensor | None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss`` plus beta times the KL estimate to ``ref_logp`` (``kl_loss_coef``) and minus the entropy bonus
    (``entropy_coef``), each aggregated over the valid tokens as the loss is; their statistics."""
    stats: dict[str, torch.Tensor] = {}
    if cfg.kl_loss_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_loss_coef > 0 needs ref_logp (the reference model's log-probs)")
        kl = torch.where(valid, kl_estimate(logp, ref_logp.detach(), cfg.kl_loss_estimator), 0.0)
        kl_term = reduce(kl, valid.float())
        loss = loss + cfg.kl_loss_coef * kl_term
        stats["kl_loss"] = kl_term.detach()
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), valid)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * reduce(entropy, valid.float())
    return loss, stats


@torch.no_grad()
def ratio_stats(surrogate_stats: dict[str, torch.Tensor], ratio: torch.Tensor,
                counted: torch.Tensor) -> dict[str, torch.Tensor]:
    """The surrogate's per-token statistics, the mean ratio and approx_kl, k3's estimate of
    KL(pi_old || pi_theta) = (r - 1) - log r >= 0 (AReaL logs the signed log r), over the tokens whose loss
    counts: a token a mask dropped has no surrogate, and at the sequence level its ratio is 0."""
    stats = {name: masked_mean(value, counted) for name, value in surrogate_stats.items()}
    r = ratio.detach()
    stats["importance_weight_mean"] = masked_mean(r, counted)
    stats["approx_kl"] = masked_mean(r - 1.0 - torch.where(counted, r.clamp(min=1e-30).log(), 0.0), counted)
    return stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               eps_clip: float, num_tokens: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss: sum_t max(1/2 (v - G)^2, 1/2 (v_clip - G)^2) / N with
    v_clip = v_old + clamp(v - v_old, -eps, eps); N = ``num_tokens`` or the mask count, at least 1."""
    valid = mask.bool()
    v = values.float()
    old = old_values.detach().float()
    target = returns.detach().float()
    v_clipped = old + (v - old).clamp(-eps_clip, eps_clip)
    unclipped_loss = 0.5 * (v - target).square()
    clipped_loss = 0.5 * (v_clipped - target).square()
    clip_active = clipped_loss > unclipped_loss
    per_token = torch.where(clip_active, clipped_loss, unclipped_loss)
    n = valid.sum() if num_tokens is None else num_tokens
    loss = (per_token * valid).sum() / max(float(n), 1.0)
    with torch.no_grad():
        stats = {"loss": loss.detach(), "clip_fraction": masked_mean(clip_active, valid),
                 "value_mean": masked_mean(v, valid)}
    return loss, stats

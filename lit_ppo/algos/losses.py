"""Policy and value losses, label-aligned ``[B, T]`` (docs/algorithms.md#policy-losses,
docs/algorithms.md#value-loss).

A policy loss is a registered per-token surrogate L_t(r_t, A_t); ``policy_loss`` supplies the ratio
(token, or GSPO's sequence ratio), the decoupled behaviour weight w_t, rejection sampling and the
aggregation, so PPO, GRPO, GSPO, GMPO, DAPO, SAPO, CISPO, DPPO, M2PO, IcePop and KPop are one code path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from lit_ppo.algos.kl import kl_estimate
from lit_ppo.algos.rejection import bernoulli_kl, rejection_sampling
from lit_ppo.utils.registry import Registry

if TYPE_CHECKING:
    from lit_ppo.config import ClipCovConfig, KLCovConfig, PPOActorConfig, TrustRegionMaskConfig

SurrogateFn = Callable[[torch.Tensor, torch.Tensor, "PPOActorConfig"],
                       tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[SurrogateFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register


@register_policy_loss("ppo")
def ppo_clip_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """L = max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi)), then min(L, c|A|) with dual clip c."""
    clipped_ratio = ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    unclipped = -advantages * ratio
    clipped = -advantages * clipped_ratio
    clip_active = unclipped < clipped  # strict: the clipped branch is the one in force
    loss = torch.where(clip_active, clipped, unclipped)
    per_token_stats = {"clip_fraction": clip_active}
    if cfg.c_clip is not None:
        dual_bound = cfg.c_clip * advantages.abs()  # binds only for A < 0
        dual_active = dual_bound < loss
        loss = torch.where(dual_active, dual_bound, loss)
        per_token_stats["dual_clip_fraction"] = dual_active
    else:
        per_token_stats["dual_clip_fraction"] = torch.zeros_like(clip_active)
    return loss, per_token_stats


@register_policy_loss("sapo")
def sapo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """SAPO soft gate: L = -g A, g = (4/tau) sigmoid(tau (r - 1)), tau = tau_pos if A > 0 else tau_neg.
    dL/dlog r = -A 4 sigma (1 - sigma) r, which is -A at r = 1 for any tau."""
    gate_pos = 4.0 / cfg.sapo_tau_pos * torch.sigmoid(cfg.sapo_tau_pos * (ratio - 1.0))
    gate_neg = 4.0 / cfg.sapo_tau_neg * torch.sigmoid(cfg.sapo_tau_neg * (ratio - 1.0))
    gate = torch.where(advantages > 0, gate_pos, gate_neg)
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -gate * advantages, {"sapo_soft_gate": gate, "clip_fraction": no_clip, "dual_clip_fraction": no_clip}


@register_policy_loss("cispo")
def cispo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """CISPO (MiniMax-M1): L = -sg(r_hat) A log r, r_hat = clip(r, 1 - eps_lo, 1 + eps_hi). The gradient,
    -r_hat A grad log pi_theta, is the paper's: the clipped weight is detached, so no token's gradient is
    clipped away. The value takes log r = log pi_theta - log pi_old for the paper's log pi_theta: the two
    differ by the constant r_hat A log pi_old."""
    clipped_ratio = ratio.detach().clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    left_band = clipped_ratio != ratio.detach()
    no_dual = torch.zeros_like(left_band)
    return -clipped_ratio * advantages * ratio.log(), {"clip_fraction": left_band, "dual_clip_fraction": no_dual}


@register_policy_loss("gpg")
def gpg_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """GPG: L = -A log r, the plain policy gradient -A grad log pi_theta with no ratio weight and no clip (the
    paper writes -A log pi_theta: the same gradient, a value lower by the constant A log pi_old)."""
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -advantages * ratio.log(), {"clip_fraction": no_clip, "dual_clip_fraction": no_clip}


@register_policy_loss("gmpo")
@register_policy_loss("unclipped")
def unclipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """L = -r A: the importance-weighted policy gradient without a clip (M2PO's objective, whose trust region
    is its mask; GMPO's, whose ratio is clipped before its geometric mean)."""
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -ratio * advantages, {"clip_fraction": no_clip, "dual_clip_fraction": no_clip}


def gmpo_log_ratio(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig) -> torch.Tensor:
    """GMPO's token clip in log space, the way the advantage pushes: min(log r, eps_hi) where A > 0,
    max(log r, -eps_lo) where A < 0, before the geometric mean."""
    return torch.where(advantages > 0, log_ratio.clamp(max=cfg.eps_clip_high),
                       torch.where(advantages < 0, log_ratio.clamp(min=-cfg.eps_clip), log_ratio))


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


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x.float() * mask).sum() / mask.sum().clamp(min=1)


def _sequence_broadcast(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row masked mean of x, placed on the row's masked tokens (0 elsewhere)."""
    mean = (x * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    return mean * mask


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


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Cov_t = (A_t - mean A) (log pi_theta_t - mean log pi_theta), the means over the valid tokens (detached)."""
    a, lp = advantages.detach().float(), logp.detach().float()
    return (a - _masked_mean(a, valid)) * (lp - _masked_mean(lp, valid)) * valid


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


def high_entropy_keep(entropy: torch.Tensor, valid: torch.Tensor, fraction: float) -> torch.Tensor:
    """True for the tokens whose entropy reaches the (1 - fraction) quantile of the valid tokens' entropies
    (linear interpolation, as torch.quantile and TRL)."""
    if not valid.any():
        return valid
    threshold = torch.quantile(entropy.detach().float()[valid], 1.0 - fraction)
    return entropy.detach().float() >= threshold


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


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                cfg: PPOActorConfig, *, behave_logp: torch.Tensor | None = None,
                num_tokens: float | None = None, num_seqs: float | None = None,
                entropy: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of one micro-batch, and detached statistics (0-d tensors).

    r_t = exp(log pi_theta - log pi_old); pi_old is the proximal policy when ``use_decoupled_loss``,
    and then every token is weighted by w_t = pi_old / pi_behave (detached), bounded or masked by
    ``cfg.rejection_sampling``. With ``importance_sampling_level='sequence'`` (GSPO) r and A are
    replaced by the sequence's s_i = exp(mean_t log r_t) and mean advantage; the gradient flows
    through s_i. Token-mean loss = sum_t L_t / N with N = ``num_tokens`` or the mask count, counted
    before rejection (rejected tokens leave the numerator only). The M2PO, trust-region and entropy masks
    narrow the numerator the same way; Clip-Cov zeroes the loss of a few tokens after the surrogate and
    KL-Cov adds its penalty to a few. ``cfg.kl_loss_coef`` adds beta times the KL estimate to ``ref_logp``,
    aggregated as the loss is.
    """
    if not (logp.shape == old_logp.shape == advantages.shape == mask.shape) or logp.dim() != 2:
        raise ValueError(f"logp, old_logp, advantages and mask must share one [B, T] shape, got "
                         f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(advantages.shape)}, {tuple(mask.shape)}")
    valid = mask.bool()
    row_tokens = valid.sum(1)
    old_logp = old_logp.detach()
    advantages = advantages.detach().float()
    stats: dict[str, torch.Tensor] = {}

    loss_mask, weight = valid, None
    if cfg.use_decoupled_loss:
        if behave_logp is None:
            raise ValueError("use_decoupled_loss=true needs behave_logp (the engine's behaviour log-probs)")
        if cfg.rejection_sampling is not None:
            loss_mask, weight, rs_stats = rejection_sampling(old_logp, behave_logp, valid, cfg.rejection_sampling)
            stats.update(rs_stats)
        else:
            log_w = old_logp.float() - behave_logp.detach().float()
            weight = torch.where(valid & torch.isfinite(log_w), log_w, 0.0).exp() * valid
            stats["behave_imp_weight"] = _masked_mean(weight, valid)
            stats["filtered_fraction"] = torch.zeros(())
    if cfg.m2_threshold is not None:
        kept = m2po_keep(behave_logp, old_logp, valid, cfg.m2_threshold)
        stats["m2po_masked_fraction"] = _masked_mean(~kept, valid)
        loss_mask = loss_mask & kept
    if cfg.trust_region_mask is not None:
        kept = trust_region_keep(logp, old_logp, advantages, cfg.trust_region_mask)
        stats["trust_region_masked_fraction"] = _masked_mean(~kept, valid)
        loss_mask = loss_mask & kept
    if cfg.top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the tokens' entropy")
        kept = high_entropy_keep(entropy, valid, cfg.top_entropy_quantile)
        stats["low_entropy_masked_fraction"] = _masked_mean(~kept, valid)
        loss_mask = loss_mask & kept
    m = loss_mask.float()

    log_ratio = torch.where(valid, logp.float() - old_logp.float(), 0.0)
    if cfg.policy_loss == "gmpo":
        log_ratio = gmpo_log_ratio(log_ratio, advantages, cfg)
    if cfg.importance_sampling_level == "sequence":
        ratio = _sequence_broadcast(log_ratio, m).exp() * m
        advantages = _sequence_broadcast(advantages, m)
    else:
        ratio = log_ratio.exp()
    per_token, per_token_stats = POLICY_LOSSES.get(cfg.policy_loss)(ratio, advantages, cfg)
    if cfg.clip_cov is not None or cfg.kl_cov is not None:
        cov = token_covariance(advantages, logp, valid)
        if cfg.clip_cov is not None:
            candidates = loss_mask & ~per_token_stats["clip_fraction"].bool()  # not clipped by the surrogate
            dropped = clip_cov_dropped(cov, candidates, int(valid.sum()), cfg.clip_cov)
            per_token = torch.where(dropped, 0.0, per_token)
            stats["clip_cov_fraction"] = _masked_mean(dropped, valid)
        if cfg.kl_cov is not None:
            chosen = kl_cov_chosen(cov, loss_mask, cfg.kl_cov)
            per_token = per_token + cfg.kl_cov.coef * log_ratio.abs() * chosen
            stats["kl_cov_fraction"] = _masked_mean(chosen, valid)
    if weight is not None:
        per_token = per_token * weight
    loss = aggregate(per_token, m, cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                     max_new_tokens=cfg.max_new_tokens, row_tokens=row_tokens)

    if cfg.kl_loss_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_loss_coef > 0 needs ref_logp (the reference model's log-probs)")
        kl = torch.where(valid, kl_estimate(logp, ref_logp.detach(), cfg.kl_loss_estimator), 0.0)
        kl_term = aggregate(kl, valid.float(), cfg.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs,
                            max_new_tokens=cfg.max_new_tokens, row_tokens=row_tokens)
        loss = loss + cfg.kl_loss_coef * kl_term
        stats["kl_loss"] = kl_term.detach()
    if entropy is not None:
        stats["entropy"] = _masked_mean(entropy.detach(), valid)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * aggregate(entropy, valid.float(), cfg.loss_agg_mode,
                                                       num_tokens=num_tokens, num_seqs=num_seqs,
                                                       max_new_tokens=cfg.max_new_tokens, row_tokens=row_tokens)
    with torch.no_grad():
        for name, value in per_token_stats.items():
            stats[name] = _masked_mean(value, valid)
        r = ratio.detach()
        stats["importance_weight_mean"] = _masked_mean(r, valid)
        # approx_kl: k3 estimate of KL(pi_old || pi_theta), (r - 1) - log r >= 0 (AReaL logs the signed log r).
        stats["approx_kl"] = _masked_mean(r - 1.0 - torch.where(valid, r.clamp(min=1e-30).log(), 0.0), valid)
        stats["loss"] = loss.detach()
    return loss, stats


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
        stats = {"loss": loss.detach(), "clip_fraction": _masked_mean(clip_active, valid),
                 "value_mean": _masked_mean(v, valid)}
    return loss, stats

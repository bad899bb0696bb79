"""The registered per-token surrogates L_t(r_t, A_t) of the policy loss (docs/algorithms.md#policy-losses).

A loss is one function registered under its name, with what it needs beside the formula: a rule on the
actor config (checked by ``lit_ppo.algos.checks``, so the config layer never imports the math) and a
transform of the token log-ratios before the ratio is formed (GMPO's log-space clip).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from lit_ppo.config.checks import check_number, fail
from lit_ppo.utils.registry import Registry

if TYPE_CHECKING:
    from lit_ppo.config import PPOActorConfig

SurrogateFn = Callable[[torch.Tensor, torch.Tensor, "PPOActorConfig"],
                       tuple[torch.Tensor, dict[str, torch.Tensor]]]
LogRatioFn = Callable[[torch.Tensor, torch.Tensor, "PPOActorConfig"], torch.Tensor]
LossRule = Callable[["PPOActorConfig"], None]


class PolicyLossRegistry(Registry[SurrogateFn]):
    """The surrogates by name, each with its optional config rule and log-ratio transform."""

    def __init__(self):
        super().__init__("policy loss")
        self._log_ratios: dict[str, LogRatioFn] = {}
        self._rules: dict[str, LossRule] = {}

    def register(self, name: str, *, log_ratio: LogRatioFn | None = None,
                 rule: LossRule | None = None) -> Callable[[SurrogateFn], SurrogateFn]:
        """Register the decorated surrogate as ``name``; ``rule(actor)`` raises a one-line ValueError for
        settings the loss cannot take, ``log_ratio(log_r, advantages, cfg)`` transforms log r_t first."""
        add = super().register(name)

        def decorator(fn: SurrogateFn) -> SurrogateFn:
            add(fn)
            if log_ratio is not None:
                self._log_ratios[name] = log_ratio
            if rule is not None:
                self._rules[name] = rule
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        super().unregister(name)
        self._log_ratios.pop(name, None)
        self._rules.pop(name, None)

    def log_ratio(self, name: str) -> LogRatioFn | None:
        """The loss's transform of the token log-ratios, or None."""
        return self._log_ratios.get(name)

    def rule(self, name: str) -> LossRule | None:
        """The loss's check of the actor config, or None."""
        return self._rules.get(name)


POLICY_LOSSES = PolicyLossRegistry()
register_policy_loss = POLICY_LOSSES.register


def _token_level_only(actor: PPOActorConfig) -> None:
    if actor.importance_sampling_level != "token":
        fail("importance_sampling_level", actor.importance_sampling_level,
             f"'token' with policy_loss={actor.policy_loss!r} (its loss is on each token's log-prob)")


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


def check_sapo(actor: PPOActorConfig) -> None:
    """Positive gate temperatures, and no decoupled loss."""
    check_number("sapo_tau_pos", actor.sapo_tau_pos, low=0.0, low_open=True)
    check_number("sapo_tau_neg", actor.sapo_tau_neg, low=0.0, low_open=True)
    if actor.use_decoupled_loss:
        fail("use_decoupled_loss", True, "false with SAPO (use_sapo_loss / policy_loss='sapo')")


@register_policy_loss("sapo", rule=check_sapo)
def sapo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """SAPO soft gate: L = -g A, g = (4/tau) sigmoid(tau (r - 1)), tau = tau_pos if A > 0 else tau_neg.
    dL/dlog r = -A 4 sigma (1 - sigma) r, which is -A at r = 1 for any tau."""
    gate_pos = 4.0 / cfg.sapo_tau_pos * torch.sigmoid(cfg.sapo_tau_pos * (ratio - 1.0))
    gate_neg = 4.0 / cfg.sapo_tau_neg * torch.sigmoid(cfg.sapo_tau_neg * (ratio - 1.0))
    gate = torch.where(advantages > 0, gate_pos, gate_neg)
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -gate * advantages, {"sapo_soft_gate": gate, "clip_fraction": no_clip, "dual_clip_fraction": no_clip}


def check_cispo(actor: PPOActorConfig) -> None:
    """The importance weight's band [1 - eps_clip, 1 + eps_clip_higher] per token, and no dual clip."""
    if actor.eps_clip_higher is None or actor.eps_clip_higher <= 0:
        fail("eps_clip_higher", actor.eps_clip_higher, "> 0 with policy_loss='cispo' (the upper bound "
                                                       "1 + eps_clip_higher of the importance weight)")
    if actor.c_clip is not None:
        fail("c_clip", actor.c_clip, "null with policy_loss='cispo' (it clips no loss)")
    _token_level_only(actor)


@register_policy_loss("cispo", rule=check_cispo)
def cispo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """CISPO (MiniMax-M1): L = -sg(r_hat) A log r, r_hat = clip(r, 1 - eps_lo, 1 + eps_hi). The gradient,
    -r_hat A grad log pi_theta, is the paper's: the clipped weight is detached, so no token's gradient is
    clipped away. The value takes log r = log pi_theta - log pi_old for the paper's log pi_theta: the two
    differ by the constant r_hat A log pi_old."""
    clipped_ratio = ratio.detach().clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    left_band = clipped_ratio != ratio.detach()
    no_dual = torch.zeros_like(left_band)
    return -clipped_ratio * advantages * ratio.log(), {"clip_fraction": left_band, "dual_clip_fraction": no_dual}


@register_policy_loss("gpg", rule=_token_level_only)
def gpg_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """GPG: L = -A log r, the plain policy gradient -A grad log pi_theta with no ratio weight and no clip (the
    paper writes -A log pi_theta: the same gradient, a value lower by the constant A log pi_old)."""
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -advantages * ratio.log(), {"clip_fraction": no_clip, "dual_clip_fraction": no_clip}


def gmpo_log_ratio(log_ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig) -> torch.Tensor:
    """GMPO's token clip in log space, the way the advantage pushes: min(log r, eps_hi) where A > 0,
    max(log r, -eps_lo) where A < 0, before the geometric mean."""
    return torch.where(advantages > 0, log_ratio.clamp(max=cfg.eps_clip_high),
                       torch.where(advantages < 0, log_ratio.clamp(min=-cfg.eps_clip), log_ratio))


def check_gmpo(actor: PPOActorConfig) -> None:
    """The sequence level: GMPO's ratio is the geometric mean of its clipped token ratios."""
    if actor.importance_sampling_level != "sequence":
        fail("importance_sampling_level", actor.importance_sampling_level,
             "'sequence' with policy_loss='gmpo' (its ratio is the geometric mean of the clipped token ratios)")


@register_policy_loss("gmpo", log_ratio=gmpo_log_ratio, rule=check_gmpo)
@register_policy_loss("unclipped")
def unclipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, cfg: PPOActorConfig):
    """L = -r A: the importance-weighted policy gradient without a clip (M2PO's objective, whose trust region
    is its mask; GMPO's, whose ratio is clipped before its geometric mean)."""
    no_clip = torch.zeros_like(ratio, dtype=torch.bool)
    return -ratio * advantages, {"clip_fraction": no_clip, "dual_clip_fraction": no_clip}

"""The advantage pipeline of one batch, label-aligned ``[B, T]``, in the order of
docs/algorithms.md#advantage-pipeline:

overlong penalty -> bias / scale / clip -> reward_norm -> KL reward -> outcome on the last generated
token -> GAE (static or dynamic lambda, token or turn unit) -> adv_norm -> GPG's alpha.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lit_ppo.algos.gae import ADVANTAGE_ESTIMATORS, validate_turn_ids
from lit_ppo.algos.kl import kl_reward
from lit_ppo.algos.lambda_fn import GaeLambdaContext, resolve_gae_lambda
from lit_ppo.algos.normalize import gpg_alpha, normalize, normalize_then_sum
from lit_ppo.algos.rewards import overlong_penalty, shape_rewards

if TYPE_CHECKING:
    from lit_ppo.config import PPOActorConfig


@dataclass
class Advantages:
    """Outputs of ``compute_advantages``; token fields are ``[B, T]`` and 0 off the mask."""

    advantages: torch.Tensor
    """A_t after adv_norm: what the policy loss uses."""
    returns: torch.Tensor
    """Critic targets."""
    kl_rewards: torch.Tensor
    """-kl_ctl * KL estimate per generated token (0 without KL)."""
    outcome_rewards: torch.Tensor
    """[B] shaped and normalised outcome reward placed on each row's last generated token."""


def last_generated_index(mask: torch.Tensor) -> torch.Tensor:
    """[B] index of each row's last generated token (0 for rows without one)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, 0).max(1).values


def compute_advantages(rewards: torch.Tensor, mask: torch.Tensor, cfg: PPOActorConfig, *,
                       group_sizes: torch.Tensor | list[int] | None = None,
                       old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                       values: torch.Tensor | None = None, final_values: torch.Tensor | None = None,
                       truncated: torch.Tensor | None = None,
                       turn_ids: torch.Tensor | None = None, reward_terms: torch.Tensor | None = None,
                       reward_weights: torch.Tensor | None = None) -> Advantages:
    """Advantages and returns of a batch from raw outcome rewards ``[B]``.

    ``reward_terms`` ``[B, K]`` (each reward function's values, NaN where it gave none) and ``reward_weights``
    ``[K]`` are read under ``cfg.multi_objective_aggregation='normalize_then_sum'`` when K > 1: they replace
    ``rewards`` in steps 2 and 3 (GDPO's decoupled normalisation).

    ``old_logp`` / ``ref_logp`` are needed when ``cfg.kl_ctl > 0``; ``values`` (``[B, T]``, state
    before token t) and ``final_values`` (``[B]``, state after the last token) come from the critic,
    and truncated rows bootstrap from ``final_values``. Without a critic V = 0.
    """
    mask = mask.bool()
    B = mask.shape[0]
    truncated = torch.zeros(B, dtype=torch.bool, device=mask.device) if truncated is None else truncated.bool()

    decoupled = (cfg.multi_objective_aggregation == "normalize_then_sum" and reward_terms is not None
                 and reward_terms.shape[1] > 1)
    if decoupled:  # GDPO: None (NaN) read as 0, as its authors' code does
        terms = shape_rewards(reward_terms.float().nan_to_num(0.0), bias=cfg.reward_bias, scaling=cfg.reward_scaling,
                              clip=cfg.reward_clip)
        R = normalize_then_sum(terms, reward_weights, cfg.reward_norm, group_sizes=group_sizes)
    else:
        R = rewards.float()
        if cfg.overlong_reward_penalty:
            R = R + overlong_penalty(mask.sum(1), max_new_tokens=cfg.max_new_tokens,
                                     overlong_tokens=cfg.overlong_tokens, factor=cfg.overlong_penalty_factor)
        R = shape_rewards(R, bias=cfg.reward_bias, scaling=cfg.reward_scaling, clip=cfg.reward_clip)
        R = normalize(R, cfg.reward_norm, group_sizes=group_sizes)

    if cfg.kl_ctl > 0:
        if old_logp is None or ref_logp is None:
            raise ValueError("kl_ctl > 0 needs old_logp and ref_logp (the reference model's log-probs)")
        kl = kl_reward(old_logp, ref_logp, mask, kl_ctl=cfg.kl_ctl, estimator=cfg.kl_estimator)
    else:
        kl = torch.zeros(mask.shape, device=mask.device)

    if cfg.mask_no_eos_with_zero:
        R = torch.where(truncated, 0.0, R)
    token_rewards = torch.zeros(mask.shape, device=mask.device)
    has_tokens = mask.any(1)
    token_rewards[has_tokens, last_generated_index(mask)[has_tokens]] = R[has_tokens]

    if isinstance(cfg.gae_lambda, str):
        if turn_ids is not None:  # the context counts turns (turn-level GAE validates them itself)
            validate_turn_ids(turn_ids, mask)
        ctx = GaeLambdaContext.from_mask(mask, turn_ids, cfg.gae_timestep_unit)
        lam = resolve_gae_lambda(cfg.gae_lambda, cfg.gae_lambda_kwargs)(ctx)
    else:
        lam = cfg.gae_lambda
    if values is None:
        values = torch.zeros(mask.shape, device=mask.device)
        bootstrap = None
    else:
        bootstrap = torch.where(truncated, final_values.float(), 0.0) if final_values is not None else None
    estimator = ADVANTAGE_ESTIMATORS.get(cfg.adv_estimator)
    advantages, returns = estimator(token_rewards, values, mask, gamma=cfg.discount, lam=lam, bootstrap=bootstrap,
                                    turn_ids=turn_ids, unit=cfg.gae_timestep_unit, kl_rewards=kl)
    advantages = normalize(advantages, cfg.adv_norm, mask=mask, group_sizes=group_sizes)
    if cfg.gpg_alpha:
        advantages = advantages * gpg_alpha(R, group_sizes, cfg.reward_norm.group_size if cfg.reward_norm else 1)
    return Advantages(advantages=advantages, returns=returns, kl_rewards=kl, outcome_rewards=R)

"""Layer 2, the PPO-family algorithm core: pure torch, no Lightning (docs/algorithms.md#the-algorithm-core)."""

from lit_ppo.algos.advantages import Advantages, compute_advantages
from lit_ppo.algos.gae import ADVANTAGE_ESTIMATORS, compute_gae, register_advantage_estimator, validate_turn_ids
from lit_ppo.algos.kl import kl_estimate, kl_reward
from lit_ppo.algos.lambda_fn import (
    GaeLambdaContext,
    relative_position_gae_lambda,
    resolve_gae_lambda,
    vapo_length_adaptive_gae,
)
from lit_ppo.algos.losses import policy_loss, value_loss
from lit_ppo.algos.normalize import normalize, normalize_then_sum
from lit_ppo.algos.proximal import approximate_prox_logp
from lit_ppo.algos.rejection import binary_kl, rejection_sampling
from lit_ppo.algos.rewards import overlong_penalty, shape_rewards
from lit_ppo.algos.surrogates import POLICY_LOSSES, register_policy_loss
from lit_ppo.utils.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS", "Advantages", "POLICY_LOSSES", "GaeLambdaContext", "Registry", "approximate_prox_logp",
    "binary_kl", "compute_advantages", "compute_gae", "kl_estimate", "kl_reward", "normalize", "normalize_then_sum",
    "overlong_penalty", "policy_loss", "register_advantage_estimator", "register_policy_loss", "rejection_sampling",
    "relative_position_gae_lambda", "resolve_gae_lambda", "shape_rewards", "validate_turn_ids", "value_loss",
    "vapo_length_adaptive_gae",
]

"""Layer 1, the schemas: dataclass configs whose fields carry their docstrings, checked on construction.

Imports nothing of lit_ppo above ``lit_ppo.utils`` and ``lit_ppo.errors``; the names that configs
refer to (registered losses and estimators, task classes) are resolved by the layers that own them.
"""

from lit_ppo.config.algo import (
    GAE_UNITS,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    LR_SCHEDULES,
    NORM_LEVELS,
    REJECTION_ACTIONS,
    REJECTION_AGGS,
    REJECTION_LEVELS,
    REJECTION_METRICS,
    ClipCovConfig,
    EvalConfig,
    GenerationConfig,
    KLCovConfig,
    NormConfig,
    OptimizerConfig,
    PPOActorConfig,
    PPOCriticConfig,
    RejectionSamplingConfig,
    TrustRegionMaskConfig,
)
from lit_ppo.config.checks import check_fields, check_value, describe, type_hints
from lit_ppo.config.keys import LIGHTNING_NAMES, ROLLOUT_KEYS, typed_key
from lit_ppo.config.model import DTYPES, ModelConfig
from lit_ppo.config.rollout import RolloutConfig

DEFAULT_ALGO = "custom"
"""The ``algo`` name of a run that names no preset (LitPPO's ``algo``)."""

__all__ = ["DEFAULT_ALGO", "DTYPES", "GAE_UNITS", "IMPORTANCE_SAMPLING_LEVELS", "KL_ESTIMATORS", "LIGHTNING_NAMES",
           "LOSS_AGG_MODES", "LR_SCHEDULES", "NORM_LEVELS", "REJECTION_ACTIONS", "REJECTION_AGGS", "REJECTION_LEVELS",
           "REJECTION_METRICS", "ROLLOUT_KEYS", "ClipCovConfig", "EvalConfig", "GenerationConfig", "KLCovConfig",
           "ModelConfig", "NormConfig", "OptimizerConfig", "PPOActorConfig", "PPOCriticConfig",
           "RejectionSamplingConfig", "RolloutConfig", "TrustRegionMaskConfig", "check_fields", "check_value",
           "describe", "type_hints", "typed_key"]

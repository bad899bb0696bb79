"""Dynamic-sampling filters: ``fn(group) -> bool`` accepts or rejects one prompt's group of samples.

``group`` is a RolloutBatch of one prompt's rows; ``group.rewards`` are the raw task rewards.
Select one with ``data.dynamic_filter_fn=lit_ppo.rollout.filters.<name>``.
"""

from __future__ import annotations

from lit_ppo.rollout.batch import RolloutBatch


def mixed_outcomes(group: RolloutBatch) -> bool:
    """DAPO dynamic sampling: keep groups with 0 < mean reward < 1. All-correct and all-wrong groups
    have zero group-normalised advantage and only dilute the gradient."""
    mean = float(group.rewards.mean())
    return 0.0 < mean < 1.0


def reward_variance(group: RolloutBatch) -> bool:
    """Keep groups whose rewards are not all equal (any reward scale)."""
    return bool((group.rewards != group.rewards[0]).any())

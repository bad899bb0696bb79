"""The ``rm`` section of ``python -m lit_ppo rm``: how reward-model training reads its preference pairs, how
long it trains and its loss's options. The model, data, trainer, logger and optimizer (``actor.optimizer``)
come from the same config groups and keys as ``fit``."""

from __future__ import annotations

from dataclasses import dataclass

from lit_ppo.config.checks import check_fields, check_number, check_positive_int, fail

RM_ALGO = "rm"
"""The ``algo`` of the rm job's config and checkpoint record: what tells its checkpoints from fit's and sft's."""


@dataclass
class RMConfig:
    """Bradley-Terry reward-model training on preference pairs (TRL's ``RewardTrainer``): a scalar head over
    the model's body scores each side, and the loss is ``-log sigmoid(r_chosen - r_rejected - margin)``."""

    epochs: int = 1
    """Passes over the training pairs (``trainer.max_steps``, when given, stops it earlier)."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    max_length: int = 1024
    """Most tokens of one side (prompt and completion, as the reward model reads it); a longer side is refused,
    naming its row."""
    center_rewards_coefficient: float | None = None
    """TRL's reward centering: adds ``coefficient * mean((r_chosen + r_rejected)^2)`` to the loss, which keeps the
    rewards near 0 (0.01 in TRL's docs); None: no centering."""
    pairs_fn: str | None = None
    """For a task's problems (``data=<task>``): ``module.function`` importable from the working directory, called
    with each problem (``lit_ppo.tasks.base.Problem``) and returning its pair, a mapping of ``chosen`` and
    ``rejected`` completions (and optionally ``margin``), or a list of such pairs. None: the data's rows are the
    pairs (``data=dataset``)."""
    shuffle: bool = True
    """Shuffle the training pairs each epoch (seeded by ``seed``)."""

    def __post_init__(self) -> None:
        check_fields(self, "rm")
        for name in ("epochs", "batch_size", "max_length"):
            check_positive_int(f"rm.{name}", getattr(self, name))
        if self.center_rewards_coefficient is not None:
            check_number("rm.center_rewards_coefficient", self.center_rewards_coefficient, low=0)
        if self.pairs_fn is not None and "." not in self.pairs_fn:
            fail("rm.pairs_fn", self.pairs_fn, "a dotted path module.function, or null")

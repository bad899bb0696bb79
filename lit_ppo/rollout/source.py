"""What the trainer's side reads of the rollouts' data module (``RolloutDataModule``): the LightningModule
(``LitPPO``) takes its settings, sampling distribution and test-split scores from it, and the callbacks
(``WeightSync``, ``GracefulStop``) push weights into its engine and pace its producer. The data module in
turn reads ``TrainedPolicy`` of the LightningModule (``lit_ppo.training.datamodule``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from lit_ppo.config import EvalConfig, RolloutConfig
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams
from lit_ppo.tasks.base import Task


@runtime_checkable
class RolloutSource(Protocol):
    """A data module that streams rollout batches (``RolloutDataModule``), as the LightningModule and the
    callbacks read it. A trainer's ``datamodule`` that is not one (None, a user's LightningDataModule) is
    told apart by ``isinstance(datamodule, RolloutSource)``."""

    rollout: RolloutConfig
    """Every rollout setting but the task, the generation and the evaluation configs."""
    eval: EvalConfig
    """How the task's test split is scored."""
    task: Task
    """The task the prompts and the rewards come from."""
    engine: RolloutEngine | None
    """The rank's rollout engine; None until the first dataloader (train or evaluation) builds it."""
    collecting: bool
    """True while a batch is being generated (from its first prompt until it is handed over): an
    interruption then abandons the iteration, whose batch never completed."""

    def sampling_params(self, tokenizer) -> SamplingParams:
        """The sampling distribution of every request (the trainer recomputes log-probs under it)."""

    def eval_problem_count(self) -> int:
        """How many test problems an evaluation scores (the first ones of the split)."""

    def evaluate(self, indices: list[int]) -> torch.Tensor:
        """The ``lit_ppo.rollout.evaluation.sum_names`` sums of the test problems at ``indices``, scored by
        the engine."""

    def iteration_done(self) -> None:
        """The iteration that took the latest batch has ended (its weights pushed): an asynchronous
        producer may go on."""

    def stop_producer(self, wait: bool = True) -> None:
        """End asynchronous rollouts (at the end of fit, or without ``wait`` on an error); a no-op
        without them."""

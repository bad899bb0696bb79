"""The collector (``lit_ppo.rollout.collector``) without a Trainer: its generate / filter / refill loop and its
accounting, with a fake engine and workflow."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.config import RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.collector import Collector
from lit_ppo.rollout.filters import mixed_outcomes
from lit_ppo.rollout.stream import PromptStream, stable_seed
from tests.unit.fakes import FakeEngineBase, Numbers

FILTER = "lit_ppo.rollout.filters.mixed_outcomes"


class SleepyEngine(FakeEngineBase):
    """Counts the wake / sleep calls around each batch."""

    version = 0

    def __init__(self):
        self.calls: list[str] = []

    def wake(self):
        self.calls.append("wake")

    def sleep(self):
        self.calls.append("sleep")


OUTCOMES = {"mixed": [0.0, 1.0], "right": [1.0, 1.0], "invalid": [math.nan, math.nan]}
"""The rewards of a group of two samples: accepted by ``mixed_outcomes``, rejected by it, dropped as invalid."""


class ScriptedWorkflow:
    """Answers each problem with the next group of ``script`` (a key of OUTCOMES); records each run."""

    pad_id = 0

    def __init__(self, script: list[str]):
        self.script = list(script)
        self.runs: list[tuple[list[int], int]] = []

    def run(self, engine, problems, seed):
        self.runs.append((list(problems), seed))
        groups = [OUTCOMES[self.script.pop(0)] for _ in problems]
        rows = 2 * len(groups)
        return RolloutBatch(input_ids=torch.ones(rows, 2, dtype=torch.long),
                            attention_mask=torch.ones(rows, 2, dtype=torch.bool),
                            loss_mask=torch.tensor([[False, True]] * rows), behave_logp=torch.zeros(rows, 2),
                            versions=torch.zeros(rows, 2, dtype=torch.long),
                            turn_ids=torch.zeros(rows, 2, dtype=torch.long),
                            rewards=torch.tensor([r for group in groups for r in group]),
                            truncated=torch.zeros(rows, dtype=torch.bool), group_sizes=torch.full((len(groups),), 2))


def collector(script: list[str], **settings) -> tuple[Collector, ScriptedWorkflow, SleepyEngine]:
    cfg = RolloutConfig(**{"batch_size": 2, "dynamic_filter_fn": FILTER, "seed": 5, **settings})
    workflow, engine = ScriptedWorkflow(script), SleepyEngine()
    accept = mixed_outcomes if cfg.dynamic_filter_fn else None
    stream = PromptStream(Numbers(8), cfg.seed)
    return Collector(engine, workflow, stream, cfg, accept, rank=0, world=1), workflow, engine


def test_a_fixed_size_batch_is_refilled_until_enough_groups_are_accepted():
    rollouts, workflow, engine = collector(["mixed", "right", "invalid", "mixed"])
    batch = rollouts.collect()
    # Two groups asked for, one accepted; then one at a time: dropped as invalid, then accepted.
    assert [len(problems) for problems, _ in workflow.runs] == [2, 1, 1]
    assert [seed for _, seed in workflow.runs] == [stable_seed(5, 0, k) for k in range(3)]
    assert batch.num_groups == 2 and batch.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert {k: v for k, v in batch.metrics.items() if k != "time/generate_s"} == {
        "rollout/accepted": 2.0, "rollout/rejected": 1.0, "rollout/invalid_rewards": 1.0}
    assert engine.calls == ["wake", "sleep"]
    assert rollouts.stream.position() == {"epoch": 0, "cursor": 4, "requests": 3}


def test_a_dynamic_size_batch_trains_on_what_was_accepted_of_batch_size_tries():
    rollouts, workflow, _ = collector(["right", "invalid", "mixed"], batch_size=3, dynamic_bs=True)
    batch = rollouts.collect()
    assert len(workflow.runs) == 1 and batch.num_groups == 1
    assert batch.metrics["rollout/rejected"] == 1.0 and batch.metrics["rollout/invalid_rewards"] == 1.0


def test_a_filter_that_keeps_the_batch_from_filling_stops_the_run_naming_it():
    rollouts, _, _ = collector(["right", "mixed"], max_attempts_factor=1)
    with pytest.raises(RunStopped) as stopped:
        rollouts.collect()
    assert str(stopped.value) == (f"data.dynamic_filter_fn={FILTER!r} accepted 1 of 2 groups, fewer than "
                                  f"data.batch_size=2 within data.max_attempts_factor=1: loosen the filter, raise "
                                  f"the factor, or use data.dynamic_bs=true")
    rollouts, _, _ = collector(["right"] * 4, dynamic_bs=True, max_attempts_factor=2)
    empty = rollouts.collect()  # the first empty batch is skipped by the trainer
    assert empty.num_rows == 0 and empty.metrics["rollout/rejected"] == 2.0
    with pytest.raises(RunStopped) as stopped:
        rollouts.collect()
    assert str(stopped.value) == (f"data.dynamic_filter_fn={FILTER!r} accepted no group in 2 consecutive iterations "
                                  f"(data.max_attempts_factor=2): loosen the filter")

"""The rollout side without a Trainer: RolloutConfig's checks, the prompt stream's shards and position, and
the collector's generate / filter / refill loop and its accounting, with a fake engine and workflow."""

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
from tests.unit.fakes import FakeEngineBase

FILTER = "lit_ppo.rollout.filters.mixed_outcomes"


def test_rollout_config_normalises_its_values_and_names_the_first_bad_key():
    cfg = RolloutConfig(engine_kwargs=None, max_logp_gap=1, devices=None)
    assert (cfg.engine_kwargs, cfg.max_logp_gap, type(cfg.max_logp_gap)) == ({}, 1.0, float)
    # The values are checked in the order of the data module's arguments: the engine first.
    with pytest.raises(ValueError, match=r"^data.engine='sglang' is invalid: must be one of 'hf', 'vllm'$"):
        RolloutConfig(engine="sglang", batch_size=0)
    with pytest.raises(ValueError, match=r"^data.turn_discount=0 is invalid: must be a number in \(0, 1\]$"):
        RolloutConfig(turn_discount=0)
    with pytest.raises(ValueError, match=r"^rollout.max_logp_gap=0 is invalid: must be a positive number, 'auto' "
                                         r"or null$"):
        RolloutConfig(max_logp_gap=0)
    with pytest.raises(ValueError, match=r"^rollout.engine_kwargs=\[1\] is invalid: must be a mapping or null$"):
        RolloutConfig(engine_kwargs=[1])  # each field's type first, named as the command line types it
    with pytest.raises(ValueError, match=r"^rollout.num_threads=0 is invalid: must be a positive integer or null$"):
        RolloutConfig(max_head_offpolicyness=1, num_threads=0)
    with pytest.raises(ValueError, match=r"^rollout.devices needs rollout=hf: the vllm engine shares its rank's "):
        RolloutConfig(engine="vllm", devices=[0])
    RolloutConfig(engine="vllm", engine_kwargs={"gpu_memory_utilization": 0.3})  # vLLM checks its own settings


class Numbers:
    """A task of ``n`` train problems, the numbers 0 to n - 1."""

    name = "numbers"

    def __init__(self, n: int):
        self.train = list(range(n))

    def problems(self, split: str) -> list[int]:
        return self.train if split == "train" else []


def test_the_ranks_shards_cover_each_epoch_once_and_the_stream_resumes_where_it_stood():
    stream = PromptStream(Numbers(10), seed=3)
    shards = [stream.shard(rank, 2) for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(10)) and len(shards[0]) == 5
    first = stream.take(4, rank=1, world=2)
    assert first == shards[1][:4] and stream.position() == {"epoch": 0, "cursor": 4, "requests": 0}
    across = stream.take(3, rank=1, world=2)  # the last of epoch 0, then epoch 1's own order
    assert across[0] == shards[1][4] and across[1:] == stream.shard(1, 2)[:2] and stream.epoch == 1
    assert stream.request_seed(1) == stable_seed(3, 1, 0) and stream.requests == 1
    resumed = PromptStream(Numbers(10), seed=3)
    resumed.restore(stream.position())
    assert resumed.take(3, 1, 2) == stream.take(3, 1, 2) and resumed.request_seed(1) == stream.request_seed(1)
    with pytest.raises(ValueError, match="task 'numbers' has fewer train problems than ranks"):
        PromptStream(Numbers(1), seed=0).take(1, rank=1, world=2)


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

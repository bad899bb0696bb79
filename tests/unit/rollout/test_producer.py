"""The asynchronous-rollout producer: the staleness bound, weight pushes between generate calls,
hand-over checks, errors and the checkpointed queue (lit_ppo.rollout.producer), with scripted parts."""

from __future__ import annotations

import io
import threading
import time

import pytest
import torch

from lit_ppo.config import PPOActorConfig
from lit_ppo.config.sections import actor_rollout_problem
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.producer import AsyncProducer, SharedEngine, batch_to_dict, drop_stale
from tests.unit.fakes import FakeEngineBase


class WeightEngine(FakeEngineBase):
    """Samples one token whose id is the current value of its single weight; ``hold`` keeps a call
    running until released (to push weights in the middle of it)."""

    def __init__(self):
        self.weight = torch.zeros(())
        self.version = 0
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def update_weights(self, weights, version):
        for _, tensor in weights:
            self.weight.copy_(tensor)
        self.version = version

    def generate(self, prompts, params):
        self.entered.set()
        seen = int(self.weight)
        self.hold.wait()
        # A push during the call must not change what the call samples with.
        assert int(self.weight) == seen
        return [[Completion([seen], [-0.5], stopped=True, version=self.version)] for _ in prompts]


def test_a_push_during_generate_reaches_the_engine_before_the_next_call():
    engine = WeightEngine()
    shared = SharedEngine(engine)
    trainer_weight = torch.tensor(3.0)
    engine.hold.clear()
    first: list = []
    producer = threading.Thread(target=lambda: first.extend(shared.generate([[1]], SamplingParams())))
    producer.start()
    assert engine.entered.wait(5)
    shared.update_weights([("w", trainer_weight)], version=1)  # returns at once: the call is still running
    trainer_weight.add_(100.0)  # the trainer goes on updating its own tensor: the push was a copy
    assert shared.version == 1 and engine.version == 0 and float(engine.weight) == 0.0
    engine.hold.set()
    producer.join(5)
    assert (first[0][0].token_ids, first[0][0].version) == ([0], 0)
    (second,), = shared.generate([[1]], SamplingParams())
    assert (second.token_ids, second.version) == ([3], 1)
    # Two pushes before a call: only the newest is loaded.
    shared.update_weights([("w", torch.tensor(5.0))], version=2)
    shared.update_weights([("w", torch.tensor(7.0))], version=3)
    (third,), = shared.generate([[1]], SamplingParams())
    assert (third.token_ids, third.version) == ([7], 3)


def batch_at(version: int, rows: int = 1, first_token: int = 0) -> RolloutBatch:
    """``rows`` one-row groups whose generated tokens carry ``version``; input_ids[:, 0] numbers the rows."""
    ids = torch.tensor([[first_token + r, 1, 2] for r in range(rows)])
    loss_mask = torch.tensor([[False, True, True]] * rows)
    return RolloutBatch(input_ids=ids, attention_mask=torch.ones(rows, 3, dtype=torch.bool), loss_mask=loss_mask,
                        behave_logp=torch.where(loss_mask, -0.5, 0.0), versions=torch.where(loss_mask, version, -1),
                        turn_ids=torch.where(loss_mask, 0, -1), rewards=torch.arange(rows, dtype=torch.float32),
                        truncated=torch.zeros(rows, dtype=torch.bool), group_sizes=torch.ones(rows, dtype=torch.long),
                        prompts=[f"p{r}" for r in range(rows)], completions=["c"] * rows,
                        metrics={"time/generate_s": 0.5})


class ScriptedRun:
    """A producer over a collector that tags each batch with the engine version at its start, and a
    trainer loop that takes, 'trains' (version += 1) and reports the iteration done."""

    def __init__(self, k: int, collect_s: float = 0.0, train_s: float = 0.0, iterations: int | None = None):
        self.version = 0
        self.started_at: list[int] = []  # the trainer's version when each batch started
        self.position = 0
        self.collect_s, self.train_s = collect_s, train_s
        self.iterations = iterations
        self.done = 0
        self.producer = AsyncProducer(self.collect, lambda: {"batches": self.position}, k, 1, self.remaining)

    def remaining(self):
        return None if self.iterations is None else self.iterations - self.done

    def collect(self) -> RolloutBatch:
        self.started_at.append(self.version)
        time.sleep(self.collect_s)
        self.position += 1
        return batch_at(self.started_at[-1], first_token=len(self.started_at) - 1)

    def train(self, n: int, ahead: int = 0) -> list[tuple[int, int, int]]:
        """(batch number, staleness at hand-over, queue size) of ``n`` iterations; each waits until
        ``ahead`` batches are queued first (the producer went as far as it may)."""
        out = []
        for _ in range(n):
            deadline = time.time() + 10
            while len(self.producer.state()[1]) < ahead and time.time() < deadline:
                time.sleep(0.001)
            batch, _, queued = self.producer.take()
            out.append((int(batch.input_ids[0, 0]), self.version - int(batch.versions[0, 1]), queued))
            time.sleep(self.train_s)
            self.version += 1
            self.done += 1
            self.producer.iteration_done()
        return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_slow_trainer_gets_batches_exactly_k_versions_old(k):
    """The producer runs ahead as far as the bound lets it before each hand-over, so batch i starts
    at version max(0, i - k) and nothing is ever more than k versions old."""
    run = ScriptedRun(k)
    run.producer.start()
    taken = run.train(8, ahead=k + 1)
    run.producer.close()
    assert [b for b, _, _ in taken] == list(range(8))
    assert run.started_at[:8] == [max(0, i - k) for i in range(8)]
    assert [s for _, s, _ in taken] == [min(i, k) for i in range(8)]
    # k + 1 batches queued before each hand-over: never more than k outstanding when one starts.
    assert [q for _, _, q in taken] == [k] * 8
    assert len(run.started_at) <= 8 + k + 1  # the last ones for iterations that never come


def test_the_trainer_waits_for_a_batch_in_progress_and_measures_the_wait():
    release = threading.Event()

    def collect():
        release.wait(5)
        return batch_at(0)

    producer = AsyncProducer(collect, lambda: {}, 1, 1, lambda: 1)  # one iteration left: one batch
    producer.start()
    threading.Timer(0.2, release.set).start()
    batch, waited, queued = producer.take()
    assert release.is_set() and waited >= 0.19 and queued == 0 and batch.num_rows == 1
    producer.close(wait=False)


def test_the_producer_thread_keeps_its_own_thread_count_whatever_other_threads_set():
    """In a fresh interpreter (a test process's earlier threads and libraries leave torch's thread state
    as they please): another thread sets the process-wide count while the producer runs (the trainer at
    fit end, a library's own thread); the producer's count stays its own, and the trainer's too."""
    import subprocess
    import sys

    code = """
import threading, torch
from lit_ppo.rollout.producer import AsyncProducer
from tests.unit.rollout.test_producer import batch_at
torch.set_num_threads(2)
seen = []
def collect():
    other = threading.Thread(target=torch.set_num_threads, args=(2,))
    other.start()
    other.join()
    seen.append(torch.get_num_threads())
    return batch_at(0)
producer = AsyncProducer(collect, lambda: {}, 1, 1, lambda: 1)
producer.start()
producer.take()
producer.close()
print(seen, torch.get_num_threads())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[1] 2"  # the producer's 1, the trainer's 2


def test_no_batch_is_generated_beyond_the_last_iteration():
    run = ScriptedRun(3, iterations=4)
    run.producer.start()
    run.train(4)
    time.sleep(0.1)
    run.producer.close()
    assert len(run.started_at) == 4


def test_an_error_of_the_producer_is_raised_on_the_trainer_thread_after_the_queue():
    calls = []

    def collect():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("task 'x' returned reward nan")
        return batch_at(0)

    producer = AsyncProducer(collect, lambda: {}, 3, 1, lambda: None)
    producer.start()
    batch, _, _ = producer.take()
    assert batch.num_rows == 1
    with pytest.raises(RuntimeError, match="returned reward nan"):
        producer.take()
    producer.close()


def test_state_holds_the_queue_and_the_position_after_it():
    run = ScriptedRun(2, train_s=0.0)
    run.producer.start()
    deadline = time.time() + 5
    # Nothing taken: k + 1 batches (the last one will be trained at version 2), then it waits.
    while len(run.producer.state()[1]) < 3 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    position, queued = run.producer.state()
    assert position == {"batches": 3} and [int(b.input_ids[0, 0]) for b in queued] == [0, 1, 2]
    run.producer.close()
    # The queue goes into a checkpoint as plain data that loads with weights_only=True.
    saved = [batch_to_dict(b) for b in queued]


    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = [RolloutBatch(**b) for b in torch.load(buffer, weights_only=True)]
    for a, b in zip(queued, loaded):
        for key, value in batch_to_dict(a).items():
            other = getattr(b, key)
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, key


def test_drop_stale_drops_exactly_the_groups_older_than_the_bound():
    # Groups: [v5, v5], [v3], [v4, v2]; at version 6 with k=2 the oldest allowed version is 4.
    parts = [batch_at(5, rows=2), batch_at(3), batch_at(4, first_token=10), batch_at(2, first_token=20)]
    batch = RolloutBatch.concat(parts, pad_id=0)
    batch.group_sizes = torch.tensor([2, 1, 2])
    batch.metrics = {"time/generate_s": 1.0}
    kept, dropped = drop_stale(batch, version=6, max_head_offpolicyness=2)
    assert dropped == 2
    assert kept.group_sizes.tolist() == [2] and kept.input_ids[:, 0].tolist() == [0, 1]
    assert kept.metrics == {"time/generate_s": 1.0}
    assert drop_stale(batch, version=6, max_head_offpolicyness=4)[1] == 0
    assert drop_stale(batch, version=6, max_head_offpolicyness=0)[0].num_rows == 0


def test_async_training_without_the_decoupled_loss_is_refused_in_one_line():
    plain, decoupled = PPOActorConfig(), PPOActorConfig(use_decoupled_loss=True)
    assert actor_rollout_problem(plain, 1.0, 0) is None and actor_rollout_problem(decoupled, 1.0, 2) is None
    message = actor_rollout_problem(plain, 1.0, 2)
    assert "\n" not in message and message.startswith("rollout.max_head_offpolicyness=2 ")
    assert "actor.use_decoupled_loss=true" in message and "algo=icepop" in message

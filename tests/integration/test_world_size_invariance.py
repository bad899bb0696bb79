"""World-size invariance: one update on the same rollout groups gives the same gradients and weights
in one process as over 2 DDP ranks and over 2 FSDP2 ranks (gloo), whatever the micro-batching; ranks
holding different numbers of groups take the same optimizer steps and nothing hangs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lit_ppo.config import RolloutConfig
from lit_ppo.models import build_tiny
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks import build_task
from tests.integration.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """8 prompt groups x 4 samples of the arithmetic task from the tiny model (behaviour log-probs
    exact, so the trainer's gap check passes), saved for the runs; the shared model cache."""
    root = tmp_path_factory.mktemp("world")
    model, tokenizer = build_tiny(cache_dir=root / "cache")
    task = build_task("arithmetic", seed=0)
    params = SamplingParams(n=4, max_new_tokens=4, allowed_token_ids=task.allowed_completion_tokens(tokenizer))
    batch = SingleTurnWorkflow(tokenizer, task, params, RolloutConfig()).run(
        HFEngine(model, tokenizer), list(task.problems("train"))[:8], seed=3)
    assert 0 < float(batch.rewards.mean()) < 1  # a learning signal
    torch.save(batch, root / "batch.pt")
    return root


def train_once(root, name: str, *args: str) -> dict:
    out = root / f"{name}.pt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "tests.integration.world_size_run", str(root / "batch.pt"), str(out),
                             "--cache", str(root / "cache"), *args], capture_output=True, text=True, timeout=300,
                            env=env, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=True)


def assert_same_update(a: dict, b: dict, tol: float = 1e-6) -> None:
    assert a["steps"] == b["steps"] == 1
    assert a["weights"].keys() == b["weights"].keys() and a["exp_avg"].keys() == b["exp_avg"].keys()
    for name in a["exp_avg"]:  # AdamW's first moment after one step is 0.1 x the gradient
        torch.testing.assert_close(a["exp_avg"][name] * 10, b["exp_avg"][name] * 10, atol=tol, rtol=0, msg=name)
    for name in a["weights"]:
        torch.testing.assert_close(a["weights"][name], b["weights"][name], atol=tol, rtol=0, msg=name)
    # Logged metrics too: each rank's means weighted by its rows / tokens, the losses added up over
    # micro-batches and ranks (timings and throughput aside).
    compared = [k for k in a["metrics"] if not k.startswith(("time/", "perf/"))]
    assert b["metrics"].keys() >= set(compared) and "actor/loss" in compared
    for key in compared:
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], abs=tol), key


@pytest.fixture(scope="module")
def alone(groups):
    """The single-process update that every 2-rank run must reproduce."""
    return train_once(groups, "alone")


def test_two_ranks_update_like_one_process_whatever_the_micro_batches(groups, alone):
    moved = max(float((alone["exp_avg"][k]).abs().max()) for k in alone["exp_avg"])
    assert moved > 1e-4  # the update is not trivially zero
    # Rank r trains on groups r, r+2, ...; micro-batches of one row (6 tokens) each, or all rows at once.
    assert_same_update(alone, train_once(groups, "ddp", "--devices", "2"))
    assert_same_update(alone, train_once(groups, "ddp_small_mb", "--devices", "2", "--mb_max_tokens", "8"))


def test_two_fsdp_ranks_update_like_one_process_whatever_the_micro_batches(groups, alone):
    fsdp = train_once(groups, "fsdp", "--devices", "2", "--strategy", "fsdp")
    assert fsdp["sharded"] and not alone["sharded"]
    assert_same_update(alone, fsdp)
    # Uneven micro-batch counts per rank also in the no-grad passes, which are collectives when sharded.
    assert_same_update(alone, train_once(groups, "fsdp_small_mb", "--devices", "2", "--strategy", "fsdp",
                                         "--mb_max_tokens", "8", "--groups", "0:0,1,2,3,4|1:5,6,7"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_with_fewer_rows_than_minibatches_takes_the_same_steps(groups, strategy):
    # As a dynamic filter leaves them: 7 groups on rank 0 and 1 (4 rows) on rank 1, 8 minibatches.
    uneven = train_once(groups, f"uneven_{strategy}", "--devices", "2", "--strategy", strategy, "--minibatches", "8",
                        "--groups", "0:0,1,2,3,4,5,6|1:7")
    assert uneven["steps"] == 1 and uneven["metrics"]["actor/skipped_steps"] == 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_without_groups_makes_every_rank_skip_the_iteration(groups, strategy):
    skipped = train_once(groups, f"empty_rank_{strategy}", "--devices", "2", "--strategy", strategy,
                         "--groups", "0:0,1,2,3,4,5,6,7|1:")
    initial, _ = build_tiny(cache_dir=groups / "cache")
    assert skipped["steps"] == 0 and skipped["exp_avg"] == {}
    for name, value in initial.state_dict().items():
        assert torch.equal(skipped["weights"][name], value), name

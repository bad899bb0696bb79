"""A fit killed between writing a periodic checkpoint and removing the one it replaces
(``checkpoint.keep=1`` then holds two, and ``last.ckpt`` the iteration before): resumed with ``--ckpt_path
last``, it goes on from the newest in the same run directory, and retention converges the next time it
drops a checkpoint, the one left behind included (Lightning keeps the checkpoint a resume started
from until then)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.integration.conftest import reap, run_cli, run_dir, sigkill

ARGS = ["logger=none", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=0",
        "trainer.enable_progress_bar=false", "checkpoint.every_n_iterations=2", "checkpoint.keep=1"]
# The fit's own process, held when retention is about to remove a checkpoint: the kill lands after
# the new periodic checkpoint is written and before the old one is gone.
HELD_RETENTION = """
import sys
from lightning.pytorch.strategies.strategy import Strategy

def hold(self, filepath):
    print("removing", filepath, flush=True)
    sys.stdin.readline()

Strategy.remove_checkpoint = hold
from lit_ppo.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def kept(directory: Path) -> dict[str, int]:
    """Checkpoint file name -> the iteration it holds."""
    return {p.name: torch.load(p, map_location="cpu", weights_only=False)["global_step"]
            for p in sorted((directory / "checkpoints").glob("*.ckpt"))}


def test_retention_killed_midway_converges_when_it_next_drops_a_checkpoint(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", HELD_RETENTION, "fit", *ARGS, "trainer.max_steps=6"], cwd=tmp_path,
                             env={**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")}, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        while line and not line.startswith("removing "):
            line = child.stdout.readline()
        assert line.startswith("removing "), child.communicate(timeout=60)[1][-3000:]
        sigkill(child)
    finally:
        reap(child)
    directory = run_dir(tmp_path)
    # Iteration 4 written, iteration 2 not yet removed; last.ckpt still holds iteration 2.
    assert kept(directory) == {"epoch=0-step=2.ckpt": 2, "epoch=0-step=4.ckpt": 4, "last.ckpt": 2}
    # `last` is the run's newest state, iteration 4: the run goes on in its directory, not branched from 2.
    resumed = run_cli(["fit", *ARGS, "trainer.max_steps=8", "--ckpt_path", "last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "branches" not in resumed.stderr and [run_dir(tmp_path)] == [directory]
    assert kept(directory) == {"epoch=0-step=8.ckpt": 8, "last.ckpt": 8}

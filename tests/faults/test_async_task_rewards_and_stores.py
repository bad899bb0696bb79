"""A Task's ``async def reward`` (or ``group_rewards``) is awaited as an async reward function is; a W&B save
directory that cannot be written is refused in one line instead of W&B writing to the system's temporary
directory; an MLflow database deleted while the run trains is reported in lit_ppo's words, naming the file and
what to do."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lit_ppo.rollout.engines.protocol import Completion
from lit_ppo.rollout.episodes.episode import batch_rewards
from lit_ppo.tasks.base import Problem
from tests.faults.filesystems import read_only_directory


class AsyncReward:
    name = "async"

    async def reward(self, problem, completion):
        await asyncio.sleep(0.01)
        return float(len(completion))


class AsyncGroupRewards(AsyncReward):
    async def group_rewards(self, problem, completions):
        await asyncio.sleep(0.01)
        return [10.0 + len(c) for c in completions]


@pytest.mark.parametrize(("task", "expected"), [(AsyncReward(), [[1.0, 3.0], [2.0, 0.0]]),
                                               (AsyncGroupRewards(), [[11.0, 13.0], [12.0, 10.0]])])
def test_an_async_task_reward_is_awaited(task, expected):
    problems = [Problem(prompt="1+1=", answer="2"), Problem(prompt="2+2=", answer="4")]
    texts = [["2", "abc"], ["ab", ""]]
    completions = [[Completion([1], [0.0], True, 0) for _ in group] for group in texts]
    scores = batch_rewards(task, problems, completions, texts)
    assert [score.rewards for score in scores] == expected


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LIT_PPO_", "WANDB_"))}
    env.update(LIT_PPO_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path))
    return env


def test_a_read_only_wandb_save_dir_is_refused_in_one_line(tmp_path):
    with read_only_directory(tmp_path / "read-only") as place:
        done = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", "logger=wandb", "logger.init_args.offline=true",
                               f"+logger.init_args.save_dir={place}/wandb", "trainer.max_steps=1"], cwd=tmp_path,
                              env=clean_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    reason = "is on a read-only filesystem" if os.geteuid() == 0 else "is not writable by this user"
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: logger.init_args.save_dir={place}/wandb cannot be written ({place} {reason}), and W&B would keep the "
        f"run in the system's temporary directory instead: give a writable directory, or leave "
        f"logger.init_args.save_dir unset for the run directory"]
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("runs/*/*/model"))


DELETE_STORE = textwrap.dedent('''
    import os

    def delete_store_in_iteration_2(group):
        """Accepts every group; the first group of iteration 2 deletes the tracking store's database file."""
        with open("probe.txt", "a") as f:
            f.write("group\\n")
        with open("probe.txt") as f:
            if sum(1 for _ in f) == 3:
                os.remove("mlflow.db")
        return True
''')


def test_a_deleted_mlflow_database_is_said_in_one_line_naming_it(tmp_path):
    (tmp_path / "probe.py").write_text(DELETE_STORE)
    done = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", "trainer.max_steps=4", "data.batch_size=2",
                           "gconfig.n_samples=2", "eval.max_problems=0", "trainer.enable_progress_bar=false",
                           "data.dynamic_filter_fn=probe.delete_store_in_iteration_2"], cwd=tmp_path,
                          env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: tracking store sqlite:///mlflow.db failed: its database file {tmp_path}/mlflow.db was deleted while "
        f"the run was tracked there (restore it from a backup and resume from last.ckpt, or resume with another "
        f"tracking URI into a new MLflow run): training stopped at the end of the iteration, which last.ckpt holds "
        f"(logger.init_args.on_error=continue trains on without tracking)"], done.stderr[-3000:]
    assert "sqlite3" not in done.stderr and "Traceback" not in done.stderr
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert 2 <= torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] < 4

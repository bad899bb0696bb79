"""A run directory has one writer and one history: resuming its last.ckpt again continues from the
latest iteration (checkpoint paths are absolute whatever the working directory and root), a second
process continuing a run while another does is refused naming the holder, and the lock ends with the
process that held it, SIGKILL included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_ppo.run.lock import lock_run_dir
from lit_ppo.run.run_dir import new_run_dir
from tests.integration.conftest import run_cli

TINY = ["logger=none", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=4",
        "trainer.enable_progress_bar=false"]
SLOW_FILTER = '''
import time


def accept_slowly(group):
    time.sleep(0.3)
    return True
'''


def step_of(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


@pytest.mark.slow
def test_resuming_last_ckpt_twice_continues_from_the_latest_iteration(tmp_path):
    # Periodic checkpoints every 2 iterations: Lightning's ModelCheckpoint writes last.ckpt beside them.
    every_two = [*TINY, "checkpoint.every_n_iterations=2"]
    first = run_cli(["fit", *every_two, "trainer.max_steps=1"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    relative = str(ckpt.relative_to(tmp_path))  # as the README's resume command gives it
    again = run_cli(["fit", *every_two, "trainer.max_steps=2", "--ckpt_path", relative], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "exists and is not empty" not in again.stderr  # continuing the run's own directory is no surprise
    # One last.ckpt (no last-v1.ckpt beside it), holding the latest iteration: resuming it again goes on.
    assert sorted(p.name for p in ckpt.parent.glob("last*")) == ["last.ckpt"]
    assert step_of(ckpt) == 2


def test_a_home_relative_root_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = SimpleNamespace(model=SimpleNamespace(algo="grpo", model=SimpleNamespace(source="tiny")),
                             data=SimpleNamespace(task="arithmetic"),
                             trainer=SimpleNamespace(default_root_dir="~/experiments", logger=None))
    path = new_run_dir(config)
    assert path.is_absolute() and path.parent == tmp_path / "home" / "experiments" / "lit_ppo"
    assert not (tmp_path / "~").exists()


@pytest.mark.slow
def test_one_process_at_a_time_continues_a_run_and_sigkill_frees_it(tmp_path):
    first = run_cli(["fit", *TINY, "trainer.max_steps=1"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    (tmp_path / "slow_filter.py").write_text(SLOW_FILTER)
    env = {**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    holder = subprocess.Popen([sys.executable, "-m", "lit_ppo", "fit", *TINY, "trainer.max_steps=100",
                               "data.dynamic_filter_fn=slow_filter.accept_slowly", "--ckpt_path", str(ckpt)],
                              cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        lock = ckpt.parent.parent / ".lock"
        deadline = time.monotonic() + 240
        while not (lock.exists() and f"pid {holder.pid} " in lock.read_text()):
            assert holder.poll() is None and time.monotonic() < deadline, "the resume did not take the run"
            time.sleep(0.05)
        second = run_cli(["fit", *TINY, "trainer.max_steps=3", "--ckpt_path", str(ckpt)], tmp_path)
        assert second.returncode == 2, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and re.match(
            rf"error: run directory \S+ is in use by pid {holder.pid} on \S+ \(lit_ppo fit ", errors[0]), errors
        assert "Traceback" not in second.stderr
        assert step_of(ckpt) == 1  # the refused process wrote nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=60)
    # The kernel released the killed holder's lock: the run can be continued.
    lock_run_dir(ckpt.parent.parent)

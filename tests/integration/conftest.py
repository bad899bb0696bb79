"""Shared helpers: run the real CLI in a subprocess on the tiny model, small batches, no tracking."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Small enough for seconds per iteration on 2 cores, large enough to exercise groups and minibatches.
FAST = ["logger=none", "trainer.max_steps=2", "data.batch_size=4", "gconfig.n_samples=4"]


def run_cli(args: list[str], cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "LIT_PPO_CACHE": str(cwd / "cache"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lit_ppo", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def run_dir(cwd: Path) -> Path:
    """The directory of the one run made in ``cwd``: runs/<experiment>/<run name>/."""
    (config,) = (cwd / "runs").glob("*/*/config.yaml")
    return config.parent


@pytest.fixture
def cli(tmp_path):
    def call(*args: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli(list(args), tmp_path, timeout, env)

    call.cwd = tmp_path
    return call

"""Every preset trains 2 RL iterations through the real CLI, in a subprocess, on the tiny model."""

from __future__ import annotations

import pytest

from lit_ppo.cli import group_options

from .conftest import FAST, run_dir

PRESETS = group_options("algo")


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_fits_two_iterations(cli, preset):
    extra = ["data.max_attempts_factor=50"] if preset == "dapo" else []
    result = cli("fit", f"algo={preset}", *FAST, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached." in result.stderr + result.stdout
    # Piped output: one plain progress line per iteration, and no dependency noise.
    lines = [line for line in result.stdout.splitlines() if line.startswith("iteration ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"], result.stdout
    assert all(f" {name} " in lines[-1] for name in ("reward", "kl", "entropy", "length", "s/it")), lines[-1]
    for noise in ("litlogger", "LeafSpec", "Loading weights", "Failed to load weights"):
        assert noise not in result.stderr, noise
    config = (run_dir(cli.cwd) / "config.yaml").read_text()
    assert f"algo: {preset}" in config


@pytest.mark.slow
def test_ppo_with_kl_reference_and_rejection_group(cli):
    result = cli("fit", "algo=ppo", "rejection=icepop", "actor.kl_ctl=0.05", "+actor.kl_estimator=k3", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]

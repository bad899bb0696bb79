"""--print_config output replays exactly with --config; the package works from a plain `pip install .`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from .conftest import REPO


def print_config(capsys, *args: str) -> str:
    """What ``fit *args --print_config`` prints, in this process (python -m lit_ppo is main)."""
    from lit_ppo.__main__ import main

    with pytest.raises(SystemExit) as exit_info:  # --print_config exits after printing
        main(["fit", *args, "--print_config"])
    out, err = capsys.readouterr()
    assert exit_info.value.code in (0, None), err
    return out


@pytest.mark.slow
def test_print_config_replays_exactly(cli, capsys, monkeypatch):
    first = cli("fit", "algo=dapo", "model=tiny", "actor.eps_clip_higher=0.3", "+actor.c_clip=3.0",
                "logger=none", "--print_config")
    assert first.returncode == 0, first.stderr[-3000:]
    config = yaml.safe_load(first.stdout)
    assert config["model"]["algo"] == "dapo"
    assert config["model"]["actor"]["eps_clip_higher"] == 0.3 and config["model"]["actor"]["c_clip"] == 3.0
    assert config["data"]["dynamic_filter_fn"] == "lit_ppo.rollout.filters.mixed_outcomes"
    path = cli.cwd / "run.yaml"
    path.write_text(first.stdout)

    # The replays in this process: the printing above was a real process's stdout.
    monkeypatch.chdir(cli.cwd)
    assert print_config(capsys, "--config", str(path)) == first.stdout
    third = print_config(capsys, "--config", str(path), "--trainer.max_steps", "7")
    assert yaml.safe_load(third)["trainer"]["max_steps"] == 7


@pytest.mark.slow
def test_config_yaml_trains(cli, capsys, monkeypatch):
    monkeypatch.chdir(cli.cwd)
    printed = print_config(capsys, "algo=rloo", "logger=none", "data.batch_size=2", "gconfig.n_samples=2")
    path = cli.cwd / "run.yaml"
    path.write_text(printed)
    result = cli("fit", "--config", str(path), "--trainer.max_steps", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=1` reached." in result.stderr + result.stdout


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv(tmp_path):
    """A non-editable install resolves conf/ and the callbacks from site-packages, from any directory."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Reuse this environment's dependencies (a path entry, so its editable lit_ppo finder stays off).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Build with this environment's setuptools (no download), install the wheel like any user would.
    offline = {**os.environ, "PIP_NO_INDEX": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", str(REPO),
                    "-w", str(tmp_path / "dist")], check=True, cwd=tmp_path, env=offline)
    wheel = next((tmp_path / "dist").glob("lit_ppo-*.whl"))
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True,
                   cwd=tmp_path, env=offline)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import lit_ppo, lit_ppo.conf, lit_ppo.callbacks.samples as s; "
                            "print(lit_ppo.__file__); print(lit_ppo.conf.__file__)"],
                           capture_output=True, text=True, cwd=elsewhere, check=True).stdout
    assert str(REPO) not in where and site in where
    result = subprocess.run([str(python), "-m", "lit_ppo", "fit", "algo=grpo", "--print_config"], capture_output=True,
                            text=True, cwd=elsewhere, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout)
    assert config["model"]["algo"] == "grpo"
    assert any(c["class_path"] == "lit_ppo.callbacks.samples.CompletionSamples" for c in config["trainer"]["callbacks"])

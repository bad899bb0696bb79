"""An MLflow run through the real CLI, in subprocesses: tagged with what ran, and continued by a resume
(same run directory, same MLflow run, metrics on at the next iteration), or replaced by a new run,
with one line saying why, when the checkpoint's MLflow run is not in the current store."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from .conftest import FAST, run_cli

# FAST with MLflow tracking in place of logger=none, to a sqlite store each test gives.
TRACKED = [arg for arg in FAST if not arg.startswith(("logger=", "trainer.max_steps="))] + [
    "trainer.enable_progress_bar=false"]


def fit(cwd: Path, store: Path, max_steps: int, *extra: str, experiment: str = "runs") -> subprocess.CompletedProcess:
    result = run_cli(["fit", *TRACKED, f"trainer.max_steps={max_steps}", *extra], cwd,
                     env={"MLFLOW_TRACKING_URI": f"sqlite:///{store}", "MLFLOW_EXPERIMENT_NAME": experiment})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def one_run(store: Path, experiment: str = "runs"):
    """The client of ``store`` and the only run of ``experiment``."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store}")
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def steps(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "rollout/reward_mean"))


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """Two iterations tracked in ``<cwd>/mlflow.db``; the working directory (the run goes on below)."""
    cwd = tmp_path_factory.mktemp("mlflow_runs")
    fit(cwd, cwd / "mlflow.db", 2)
    return cwd


@pytest.mark.slow
def test_a_resumed_run_continues_its_directory_and_mlflow_run(first):
    cwd = first
    client, run = one_run(cwd / "mlflow.db")
    (run_dir,) = (cwd / "runs" / "runs").iterdir()
    tags = run.data.tags
    assert {k: tags[k] for k in ("algo", "task", "model", "engine", "world_size", "lit_ppo_version")} == {
        "algo": "grpo", "task": "arithmetic", "model": "tiny", "engine": "hf", "world_size": "1",
        "lit_ppo_version": "0.1.0"}
    assert tags["git_sha"] and Path(tags["run_dir"]) == run_dir.resolve()
    assert run.info.status == "FINISHED" and steps(client, run.info.run_id) == [1, 2]
    started = (run_dir / "config.yaml").read_text()

    resumed = fit(cwd, cwd / "mlflow.db", 4, "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"))
    assert [line for line in resumed.stderr.splitlines() if line.startswith("note:")] == [
        "note: resuming with trainer.max_steps=4 (the run had 2)"]
    assert f"run directory: {run_dir.relative_to(cwd)}\n" in resumed.stderr  # under the working directory: relative
    assert f"mlflow run id: {run.info.run_id} " in resumed.stderr
    client, again = one_run(cwd / "mlflow.db")
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert steps(client, run.info.run_id) == [1, 2, 3, 4]  # on at the next iteration, nothing twice
    assert again.data.tags["run_dir"] == tags["run_dir"]
    # MLflow never changes a param: the run's first settings stay, the resume's changes are beside them.
    assert again.data.params["trainer.max_steps"] == "2"
    (changed,) = [key for key in again.data.params if key.startswith("resumed-")]
    assert re.fullmatch(r"resumed-\d{8}-\d{6}/trainer\.max_steps", changed) and again.data.params[changed] == "4"
    assert list((cwd / "runs" / "runs").iterdir()) == [run_dir]
    # config.yaml is what the run started with; the resume's own config is beside it.
    assert (run_dir / "config.yaml").read_text() == started
    (resume_config,) = run_dir.glob("config-resumed-*.yaml")
    assert "max_steps: 4" in resume_config.read_text() and "max_steps: 2" in started
    import torch

    assert torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)[
        "global_step"] == 4


@pytest.mark.slow
def test_a_checkpoint_whose_mlflow_run_is_elsewhere_starts_a_new_run(first, tmp_path):
    cwd = first
    client, original = one_run(cwd / "mlflow.db")
    (checkpoint,) = cwd.glob("runs/runs/*/checkpoints/last.ckpt")
    step = torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]
    other = tmp_path / "other.db"
    resumed = fit(cwd, other, step + 1, "--ckpt_path", str(checkpoint), experiment="elsewhere")
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note: --ckpt_path")]
    assert notes == [f"note: --ckpt_path {checkpoint}: its MLflow run {original.info.run_id} (of sqlite:///"
                     f"{cwd / 'mlflow.db'}) is not in sqlite:///{other}: starting a new run"], resumed.stderr[-3000:]
    new_client, new = one_run(other, "elsewhere")
    assert new.info.status == "FINISHED" and steps(new_client, new.info.run_id) == [step + 1]
    new_dir = Path(new.data.tags["run_dir"])
    assert new_dir.parent == (cwd / "runs" / "elsewhere").resolve()
    assert (new_dir / "config.yaml").is_file() and (new_dir / "checkpoints" / "last.ckpt").is_file()

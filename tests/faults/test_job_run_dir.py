"""A job's run directory (``LIT_PPO_JOB_RUN_DIR``) that holds files but no run (the working directory, say) is
refused in one line before anything is written, and the export at the end of fit never deletes a directory
that no export wrote."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lit_ppo.errors import ConfigError
from lit_ppo.run.run_dir import JOB_LOGS, JOB_MARKER, JOB_RUN_DIR_ENV, job_run_dir


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def test_a_working_directory_as_the_job_directory_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine\n")
    (tmp_path / "train.py").write_text("print('my script')\n")
    before = tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LIT_PPO_", "SLURM_"))}
    done = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", "trainer.max_steps=1"], cwd=tmp_path,
                          env={**env, JOB_RUN_DIR_ENV: str(tmp_path), "LIT_PPO_CACHE": str(tmp_path.parent / "cache")},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr == (f"error: {JOB_RUN_DIR_ENV}={tmp_path} holds files but no lit_ppo run, and a job's run "
                           f"directory is new or empty (a scheduler makes it so): unset {JOB_RUN_DIR_ENV}, or name a "
                           f"new or empty directory\n")
    assert tree(tmp_path) == before  # no mlflow.db, no run, no marker


@pytest.mark.parametrize("state", ["new", "empty", "the job's logs"])
def test_a_new_or_empty_job_directory_is_taken_and_marked(tmp_path, monkeypatch, state):
    path = tmp_path / "job" / "run"
    if state != "new":
        path.mkdir(parents=True)
    if state == "the job's logs":  # sbatch opens them before the job starts
        (path / JOB_LOGS).mkdir()
        (path / JOB_LOGS / "42.err").write_text("")
    monkeypatch.setenv(JOB_RUN_DIR_ENV, str(path))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert job_run_dir() == path
    assert (path / JOB_MARKER).read_text() == "42"
    assert job_run_dir() == path  # the same job, requeued


def test_a_file_as_the_job_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "run").write_text("not a directory")
    monkeypatch.setenv(JOB_RUN_DIR_ENV, str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=f"^{JOB_RUN_DIR_ENV}=.*/run is a file, not a run directory: unset "):
        job_run_dir()
    assert (tmp_path / "run").read_text() == "not a directory"


@pytest.mark.parametrize("content", ["user files", "an earlier export"])
def test_the_end_export_replaces_only_what_an_export_wrote(tmp_path, content):
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lit_ppo.callbacks.export import ExportModel
    from lit_ppo.config.model import MODEL_RECORD

    place = tmp_path / "exports"
    place.mkdir()
    (place / ("weights.bin" if content == "user files" else MODEL_RECORD)).write_text("kept")
    before = tree(tmp_path)
    trainer = L.Trainer(default_root_dir=tmp_path / "run", max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[ExportModel(dirpath=place)])
    export = trainer.callbacks[0]
    if content == "an earlier export":
        export.on_fit_start(trainer, BoringModel())  # nothing to refuse: the end of fit replaces it
        return
    with pytest.raises(ConfigError) as refused:
        trainer.fit(BoringModel())
    assert str(refused.value) == (f"ExportModel dirpath={place}: holds 'weights.bin', which no lit_ppo export wrote "
                                  f"and the export at the end of fit would delete: move it, or give a new or empty "
                                  f"directory")
    assert trainer.global_step == 0 and tree(tmp_path) == before

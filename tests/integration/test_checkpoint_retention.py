"""checkpoint.keep keeps the newest periodic checkpoints (and last.ckpt), counted on a real fit and on
its resume, which goes on deleting the oldest of the run's checkpoints, each state written once; 0 keeps
last.ckpt alone."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from lit_ppo.training.checkpoint_io import AtomicCheckpointIO
from tests.integration.conftest import run_dir

TINY = ["logger=none", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=0",
        "trainer.enable_progress_bar=false", "checkpoint.every_n_iterations=2"]


def kept(directory: Path) -> dict[str, int]:
    """Checkpoint file name -> the iteration it holds."""
    return {p.name: torch.load(p, map_location="cpu", weights_only=False)["global_step"]
            for p in sorted((directory / "checkpoints").glob("*.ckpt"))}


def test_the_newest_checkpoints_are_kept_across_a_resume(cli_here, tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the run's config YAML is written, then removed
    written = []
    save = AtomicCheckpointIO.save_checkpoint

    def recorded(self, checkpoint, path, storage_options=None):
        written.append((Path(path).name, checkpoint["global_step"]))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", recorded)
    first = cli_here("fit", *TINY, "checkpoint.keep=2", "trainer.max_steps=7")
    assert first.returncode == 0, first.stderr[-3000:]
    directory = run_dir(cli_here.cwd)
    # Written at iterations 2, 4 and 6: the newest two stay, and last.ckpt holds iteration 7.
    assert kept(directory) == {"epoch=0-step=4.ckpt": 4, "epoch=0-step=6.ckpt": 6, "last.ckpt": 7}
    # Each state once: last.ckpt beside each periodic checkpoint, and at the end (not again after the evaluation).
    assert written == [(name, step) for step in (2, 4, 6) for name in (f"epoch=0-step={step}.ckpt", "last.ckpt")] + [
        ("last.ckpt", 7)]
    written.clear()
    again = cli_here("fit", *TINY, "checkpoint.keep=2", "trainer.max_steps=10",
                     "--ckpt_path", str(directory / "checkpoints" / "last.ckpt"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert kept(directory) == {"epoch=0-step=8.ckpt": 8, "epoch=0-step=10.ckpt": 10, "last.ckpt": 10}
    # Ending at a periodic checkpoint: its last.ckpt is the end's.
    assert written == [(name, step) for step in (8, 10) for name in (f"epoch=0-step={step}.ckpt", "last.ckpt")]
    assert list(temp.glob("lit_ppo_*")) == []  # neither the fit nor its resume left its config file


def test_keep_0_leaves_last_ckpt_alone(cli_here):
    result = cli_here("fit", *TINY, "checkpoint.keep=0", "trainer.max_steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert kept(run_dir(cli_here.cwd)) == {"last.ckpt": 3}


def test_checkpointing_switched_off_writes_no_checkpoint_and_still_exports_the_model(cli_here):
    result = cli_here("fit", *TINY, "trainer.enable_checkpointing=false", "trainer.max_steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    directory = run_dir(cli_here.cwd)
    assert not list(directory.rglob("*.ckpt"))
    assert (directory / "model" / "model.safetensors").is_file()

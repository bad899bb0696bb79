"""logger=tensorboard and logger=csv through the real CLI, in subprocesses: both write every iteration's
metrics into the run directory, and logger=tensorboard without the tensorboard package fails before
the run begins with one line saying how to install it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import FAST, REPO, run_cli, run_dir

TWO = [arg for arg in FAST if not arg.startswith("logger=")] + ["trainer.enable_progress_bar=false"]
LIGHTNING_SEES = ("from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE as a, "
                  "_TENSORBOARDX_AVAILABLE as b; print(bool(a), bool(b))")


@pytest.mark.slow
def test_tensorboard_writes_every_iteration_into_the_run_directory(cli):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = cli("fit", "logger=tensorboard", *TWO)
    assert result.returncode == 0, result.stderr[-3000:]
    (events,) = run_dir(cli.cwd).glob("tensorboard/version_0/events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("rollout/reward_mean")] == [1, 2]
    # The run summary says where the event files are, as a command that opens them.
    assert f"  tensorboard    tensorboard --logdir {events.parent.relative_to(cli.cwd)}" in result.stdout.splitlines()


@pytest.mark.slow
def test_csv_writes_every_iteration_into_the_run_directory(cli_here):
    # In this process (the tensorboard fit above is the real subprocess of this kind).
    cli = cli_here
    result = cli("fit", "logger=csv", "samples.every_n_iterations=0", *TWO)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = run_dir(cli.cwd) / "csv" / "version_0" / "metrics.csv"
    with open(metrics, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["rollout/reward_mean"]]
    assert f"  csv metrics    {metrics.relative_to(cli.cwd)}" in result.stdout.splitlines()
    assert not (run_dir(cli.cwd) / "samples.jsonl").exists()  # samples.every_n_iterations=0: none logged
    assert [int(row["step"]) for row in rows] == [1, 2]
    assert all(float(row["rollout/reward_mean"]) >= 0 for row in rows)


def without_tensorboard(tmp_path: Path) -> dict:
    """The environment of a Python that has no tensorboard: a sitecustomize puts in place of the
    site-packages that hold it a copy of that directory (symlinks) without tensorboard's files, so
    neither imports nor package metadata (what Lightning checks) find it."""
    import tensorboard

    site = Path(tensorboard.__file__).resolve().parents[1]
    overlay = tmp_path / "site-packages"
    overlay.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith("tensorboard"):
            (overlay / entry.name).symlink_to(entry)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        f"import sys\nsys.path[:] = [{str(overlay)!r} if p == {str(site)!r} else p for p in sys.path]\n")
    return {"PYTHONPATH": str(shim)}


def test_tensorboard_missing_fails_at_once_with_one_line(tmp_path):
    env = without_tensorboard(tmp_path)
    seen = subprocess.run([sys.executable, "-c", LIGHTNING_SEES], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=120)
    assert seen.stdout.split() == ["False", "False"], seen.stderr[-2000:]  # the package is missing for real

    result = run_cli(["fit", "logger=tensorboard", *TWO], tmp_path, timeout=120, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: trainer.logger TensorBoardRunLogger needs the tensorboard package, which is not "
                      "installed: pip install tensorboard"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # before the run began, so before any model loaded

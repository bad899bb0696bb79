"""A sweep killed with SIGKILL (as the OOM killer kills) takes its running fit with it: the fit gets
one SIGTERM, saves last.ckpt of its last completed iteration, marks its MLflow run KILLED, exits 143 and
frees its run directory, instead of training on alone."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.faults.test_graceful_stop import GROUPS, PROBE

PR_SET_CHILD_SUBREAPER = 36
"""prctl option: orphaned descendants become this process's children, so that the test can wait for the
fit (and read its exit code) once the sweep that started it is gone."""


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_for(condition, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel request is Linux's")
def test_a_sigkilled_sweep_stops_its_fit_which_saves_and_frees_its_run(tmp_path):
    import mlflow

    (tmp_path / "progress_probe.py").write_text(PROBE)
    probe = tmp_path / "probe.txt"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "PROBE_FILE": str(probe), "MLFLOW_TRACKING_URI": uri}
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "lit_ppo", "sweep", "seed=1,2", "trainer.max_steps=200", f"data.batch_size={GROUPS}",
             "gconfig.n_samples=2", "eval.max_problems=0", "data.dynamic_filter_fn=progress_probe.accept",
             "--experiment", "killed"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The first fit has completed an iteration and is generating the next.
        wait_for(lambda: sweep.poll() is not None or (probe.exists() and len(probe.read_text().split()) > GROUPS),
                 "second iteration", 300)
        assert sweep.poll() is None, "the sweep ended early"
        (fit,) = children(sweep.pid)
        # The fit writes its stderr to a file that only the sweep reads: opened here, it is read after the sweep.
        fit_stderr = open(f"/proc/{fit}/fd/2", "rb")
        sweep.send_signal(signal.SIGKILL)
        assert sweep.wait(timeout=10) == -signal.SIGKILL
        ended = []  # the fit is now this process's child (subreaper): its exit status can be read
        wait_for(lambda: ended.append(os.waitpid(fit, os.WNOHANG)) or ended[-1][0] == fit, "end of the fit", 120)
        assert os.waitstatus_to_exitcode(ended[-1][1]) == 128 + signal.SIGTERM
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in children(os.getpid()):  # never leave a fit training on after a failure
            if pid != sweep.pid:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)

    with fit_stderr:
        said = fit_stderr.read().decode()
    # One SIGTERM, however the sweep's threads ended: the iteration in flight finished, none was abandoned.
    received = [line for line in said.splitlines() if line.startswith("received SIGTERM")]
    assert len(received) == 1 and received[0].startswith("received SIGTERM: finishing iteration "), said[-3000:]
    assert "stopped by SIGTERM after iteration" in said, said[-3000:]
    (ckpt,) = tmp_path.glob("runs/killed/*/checkpoints/last.ckpt")
    step = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert 1 <= step < 200
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]  # the second fit never started
    with open(ckpt.parent.parent / ".lock", "a") as lock:  # free: a resume may take it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

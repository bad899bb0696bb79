"""``scheduler=ray``: its one-line errors, and a real Ray Train job of 2 CPU workers on a local Ray
cluster that the command starts (``ray.init()``): SIGTERM to the driver stops it with last.ckpt, and a
resume continues the run, in one run directory and one MLflow run, with no Ray process left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import torch

import lit_ppo.launch.lightning_cli as lightning_cli
from lit_ppo.__main__ import main

from .conftest import FAST, REPO, wait_for_text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.parametrize("args,expected", [
    (["scheduler.num_workers=0"], "scheduler.num_workers=0 is invalid: must be a positive integer"),
    (["scheduler.num_workers=two"], "scheduler.num_workers='two' is invalid: must be an integer"),
    (["scheduler.resources_per_worker={CPU: -1}"],
     "scheduler.resources_per_worker.CPU=-1 is invalid: must be a number >= 0 of a Ray resource"),
    (["scheduler.resources_per_worker=[1]"], "scheduler.resources_per_worker=[1] is invalid: must be a mapping"),
    (["scheduler.resources_per_worker={CPU: 1, GPU: 2}"],
     "scheduler.resources_per_worker.GPU=2 is invalid: each worker is one rank on one device: at most 1"),
    (["scheduler.address=''"], "scheduler.address='' is invalid: must be host:port, auto or null"),
    (["scheduler.address=nowhere"], "scheduler.address='nowhere' is invalid: must be host:port"),
    (["scheduler.num_worker=2"], "scheduler.num_worker is not a key (did you mean scheduler.num_workers?)"),
    (["scheduler.nodes=2"], "scheduler.nodes is not a key of scheduler=ray: allowed: address, num_workers, "
                            "resources_per_worker"),
    (["trainer.strategy=ddp_spawn"],
     "trainer.strategy=ddp_spawn is not supported with scheduler=ray: it runs trainer=ddp or trainer=cpu"),
    (["actor.eps_clip=-1"], "actor.eps_clip=-1 is invalid: must be a finite number >= 0.0"),
])
def test_bad_settings_are_one_line_and_exit_2(args, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lightning_cli, "LitPPOCLI", None)  # nothing is instantiated: no model loads
    assert main(["fit", "logger=none", "scheduler=ray", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: " + expected), err
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_unreachable_address_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    port = _closed_port()
    assert main(["fit", "logger=none", "scheduler=ray", f"scheduler.address=127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: scheduler.address=127.0.0.1:{port}: no Ray cluster answers there (Connection refused)\n"
    assert not (tmp_path / "runs").exists()


def test_missing_ray_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["fit", "logger=none", "scheduler=ray"]) == 2
    assert capsys.readouterr().err == ("error: scheduler=ray needs Ray Train, which is not installed: pip install -r "
                                       "requirements.txt (ray[train])\n")
    assert not (tmp_path / "runs").exists()


def test_only_fit_is_submitted_and_print_config_shows_each_workers_trainer(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "logger=none", "scheduler=ray"]) == 2
    assert capsys.readouterr().err == "error: scheduler=ray submits fit only: run validate here (scheduler=local)\n"
    with pytest.raises(SystemExit):
        main(["fit", "logger=none", "trainer=ddp", "scheduler=ray", "scheduler.num_workers=4", "--print_config"])
    printed = capsys.readouterr().out
    assert "strategy: ddp" in printed and "devices: 1" in printed and "accelerator: cpu" in printed
    assert not (tmp_path / "runs").exists()


def _ray_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the Ray clusters whose session files are under ``temp_dir``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(temp_dir in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.slow
def test_two_cpu_workers_train_stop_on_sigterm_and_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    probe = tmp_path / "probe"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # The preset's checkpointing (last.ckpt of the final iteration from GracefulStop) and a probe per rank.
    callbacks = ("trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
                 "{every_n_train_steps: 20, save_last: true, save_top_k: -1}}, "
                 "{class_path: lit_ppo.callbacks.progress.IterationProgress}, "
                 f"{{class_path: tests.integration.rank_probe.RankProbe, init_args: {{out_dir: '{probe}'}}}}]")
    fast = [a for a in FAST if a not in ("logger=none",) and not a.startswith("trainer.max_steps")]
    # A local cluster of this machine's 2 cores, light: no dashboard (the command's own choice), its
    # session files in ray_tmp; the workers inherit this environment (the test's RankProbe on PYTHONPATH).
    env = {**os.environ, "PYTHONPATH": str(REPO), "LIT_PPO_CACHE": str(tmp_path / "cache"), "RAY_TMPDIR": ray_tmp,
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "lit_ppo", "fit", "algo=grpo", *fast, callbacks, "scheduler=ray",
               "scheduler.num_workers=2"]
    log = tmp_path / "job.log"
    try:
        job = subprocess.Popen([*command, "trainer.max_steps=40"], cwd=tmp_path, env=env, stdout=log.open("w"),
                               stderr=subprocess.STDOUT)
        wait_for_text(log, "iteration 2/40", job, timeout=900)  # a Ray cluster starts slowly on 2 busy cores
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=240) == 143, log.read_text()[-3000:]
        first = log.read_text()
        (run_dir,) = (tmp_path / "runs" / "lit_ppo").iterdir()
        assert f"run directory: {run_dir}" in first and "received SIGTERM" in first
        assert "world_rank=1" in first  # Ray started the second worker
        last = run_dir / "checkpoints" / "last.ckpt"
        stopped_at = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
        assert 2 <= stopped_at < 40, first[-3000:]
        assert f"stopped by SIGTERM after iteration {stopped_at}" in first
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
        assert run.info.status == "KILLED"
        time.sleep(2)
        assert not _ray_processes(ray_tmp), "the stopped job left Ray processes behind"

        # The resume: the same fit continues the run in its directory and MLflow run.
        total = stopped_at + 2
        result = subprocess.run([*command, f"trainer.max_steps={total}", "--ckpt_path", str(last)], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"Restoring states from the checkpoint path at {last}" in result.stderr + result.stdout
        assert [p.name for p in run_dir.parent.iterdir()] == [run_dir.name]  # no other run was made
        assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == total
        ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(2)]
        assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [total, total]
        assert [r["ckpt_dir"] for r in ranks] == [str(run_dir / "checkpoints")] * 2  # rank 1's by broadcast
        assert ranks[0]["initial"] == ranks[1]["initial"] and ranks[0]["final"] == ranks[1]["final"]
        assert ranks[0]["final"] != ranks[0]["initial"]

        (again,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
        assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
        assert again.data.tags["world_size"] == "2"
        assert run.info.run_name == run_dir.name
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")]
        assert sorted(steps) == list(range(1, total + 1))  # rank 0 alone logs: one value per iteration, none twice
        time.sleep(2)
        assert not _ray_processes(ray_tmp), "the job left Ray processes behind"
    finally:
        for proc in _ray_processes(ray_tmp):
            proc.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_failed_worker_is_one_line_with_the_report_in_error_log(tmp_path, capsys):
    from ray.train import WorkerGroupError

    from lit_ppo.schedulers.ray import _report_failure

    cause = RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom")
    assert _report_failure(WorkerGroupError("training failed", {1: cause}), tmp_path) == 1
    assert capsys.readouterr().err == (f"error: the Ray job failed on rank 1: ValueError: boom (details in "
                                       f"{tmp_path / 'error.log'})\n")
    assert "training failed" in (tmp_path / "error.log").read_text()

"""``scheduler=slurm``: the batch script a submission writes, its one-line errors, and the script run for
real on this machine, with an ``srun`` shim that starts the tasks of a 2-node CPU job as local processes
with the SLURM_* variables Slurm gives them and a fake ``scontrol`` that records the requeue."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lit_ppo.launch.lightning_cli as lightning_cli
from lit_ppo.__main__ import main

from .conftest import FAST, REPO, wait_for_text

SRUN = """#!/bin/bash
# srun inside a batch job: SLURM_JOB_NUM_NODES x SLURM_NTASKS_PER_NODE tasks of "$@", here all local.
while [[ $1 == -* ]]; do shift; done  # srun's own options (--kill-on-bad-exit=1)
nodes=$SLURM_JOB_NUM_NODES; per=$SLURM_NTASKS_PER_NODE; pids=()
for ((node = 0; node < nodes; node++)); do
  for ((task = 0; task < per; task++)); do
    SLURM_PROCID=$((node * per + task)) SLURM_LOCALID=$task SLURM_NODEID=$node SLURM_NTASKS=$((nodes * per)) "$@" &
    pids+=($!); echo $! >> "$SRUN_PIDS"
  done
done
status=0
for pid in "${pids[@]}"; do wait "$pid"; code=$?; if ((code > status)); then status=$code; fi; done
exit $status
"""
SCONTROL = """#!/bin/bash
echo "$@" >> "$SCONTROL_LOG"
"""


def dry_run(capsys, *args: str) -> tuple[Path, str, list[str]]:
    """(script path, script text, its #SBATCH lines) of a ``scheduler.dry_run=true`` submission."""
    assert main(["fit", *args, "scheduler=slurm", "scheduler.dry_run=true"]) == 0
    out, err = capsys.readouterr()
    path = Path(re.search(r"batch script: (\S+)", err).group(1))
    assert path.read_text() == out
    return path, out, [line for line in out.splitlines() if line.startswith("#SBATCH")]


def test_script_has_the_allocation_and_the_same_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lightning_cli, "LitPPOCLI", None)  # nothing is instantiated: no model loads
    path, text, sbatch = dry_run(capsys, "algo=rloo", "logger=none", "actor.eps_clip=0.3", "scheduler.nodes=2",
                                 "scheduler.gpus_per_node=8", "scheduler.cpus_per_task=12", "scheduler.time=1-00:00",
                                 "scheduler.partition=gpu", "scheduler.account=rl", "scheduler.job_name=rloo",
                                 "scheduler.extra_sbatch=['--mem=0',--exclusive]")
    run_dir = path.parent.parent
    assert run_dir.parent == tmp_path / "runs" / "lit_ppo" and run_dir.name.startswith("rloo-arithmetic-tiny-")
    logs = run_dir / "slurm"
    assert sbatch == ["#SBATCH --job-name=rloo", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8",
                      "#SBATCH --gpus-per-node=8", "#SBATCH --cpus-per-task=12", "#SBATCH --time=1-00:00",
                      "#SBATCH --partition=gpu", "#SBATCH --account=rl", f"#SBATCH --output={logs}/%j.out",
                      f"#SBATCH --error={logs}/%j.err", "#SBATCH --open-mode=append", "#SBATCH --signal=USR1@90",
                      "#SBATCH --requeue", "#SBATCH --mem=0", "#SBATCH --exclusive"]
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert srun == (f"srun --kill-on-bad-exit=1 {sys.executable} -m lit_ppo fit algo=rloo logger=none "
                    f"actor.eps_clip=0.3 trainer.accelerator=gpu trainer.devices=8 trainer.num_nodes=2 "
                    f"trainer.strategy=ddp trainer.precision=bf16-mixed \"${{resume[@]}}\"")
    assert f"export LIT_PPO_JOB_RUN_DIR={run_dir}\n" in text and f"cd {tmp_path}\n" in text
    assert f"last={run_dir}/checkpoints/last.ckpt\n" in text
    assert 'if [ -e "$last" ]; then resume=(--ckpt_path "$last"); fi\n' in text  # FSDP's last.ckpt is a directory
    assert 'if [ "$status" -eq 138 ]; then scontrol requeue "$SLURM_JOB_ID"; fi' in text


def test_a_gpu_job_trains_in_bf16_and_the_submission_says_what_to_know(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(lightning_cli, "LitPPOCLI", None)

    def submitted(*args: str) -> tuple[str, list[str]]:
        assert main(["fit", *args, "scheduler=slurm", "scheduler.dry_run=true"]) == 0
        out, err = capsys.readouterr()
        (srun,) = [line for line in out.splitlines() if line.startswith("srun ")]
        return srun, [line for line in err.splitlines() if not line.startswith(("run directory:", "batch script:"))]

    srun, lines = submitted("logger=none", "scheduler.gpus_per_node=2", "scheduler.time=30")
    assert " trainer.precision=bf16-mixed " in srun
    assert lines == ["time limit: 30 (scheduler.time); 90 s before it the run saves last.ckpt and the job is "
                     "requeued to continue",
                     "note: the job trains on 2 GPUs per node in trainer.precision=bf16-mixed (give "
                     "trainer.precision=32-true for float32)"]
    srun, lines = submitted("logger=none", "scheduler.gpus_per_node=2", "trainer.precision=32-true")
    assert "bf16" not in srun and srun.count("trainer.precision=32-true") == 1 and len(lines) == 1
    srun, lines = submitted("scheduler.nodes=2")  # a CPU job tracked to the default sqlite:///mlflow.db
    assert "precision" not in srun
    assert lines[1:] == ["warning: 2 nodes track to sqlite:///mlflow.db, a SQLite file: on a shared filesystem "
                         "its locks may fail or stall; set MLFLOW_TRACKING_URI to an MLflow server (mlflow server) "
                         "or a database for multi-node jobs"]
    _, lines = submitted("scheduler.nodes=2", "logger=none")
    assert len(lines) == 1


def test_cpu_job_is_one_task_per_node_over_ddp_and_print_config_shows_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _, text, sbatch = dry_run(capsys, "logger=none")
    assert "#SBATCH --nodes=1" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert not any("gpus" in line for line in sbatch)
    assert "trainer.devices=1 trainer.num_nodes=1 " in text and "strategy" not in text  # one process
    _, text, _ = dry_run(capsys, "logger=none", "scheduler.nodes=3")
    assert "trainer.accelerator=cpu trainer.devices=1 trainer.num_nodes=3 trainer.strategy=ddp " in text
    made = set((tmp_path / "runs" / "lit_ppo").iterdir())
    with pytest.raises(SystemExit):  # the config the job runs, nothing written or submitted
        main(["fit", "logger=none", "scheduler=slurm", "scheduler.nodes=2", "--print_config"])
    printed = capsys.readouterr().out
    assert "num_nodes: 2" in printed and "strategy: ddp" in printed
    assert set((tmp_path / "runs" / "lit_ppo").iterdir()) == made


def test_submits_with_sbatch_and_prints_the_job_id(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\necho \"$@\" > {tmp_path}/sbatch.args\necho '9876;cluster'\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "logger=none", "scheduler=slurm"]) == 0
    out, err = capsys.readouterr()
    script = re.search(r"batch script: (\S+)", err).group(1)
    assert (tmp_path / "sbatch.args").read_text().split() == ["--parsable", script]
    assert out.startswith("submitted Slurm job 9876;")


@pytest.mark.parametrize("args,expected", [
    (["scheduler=slurm", "scheduler.nodes=0"], "scheduler.nodes=0 is invalid: must be a positive integer"),
    (["scheduler=slurm", "scheduler.gpus_per_node=-1"],
     "scheduler.gpus_per_node=-1 is invalid: must be an integer >= 0 (0 for a CPU job)"),
    (["scheduler=slurm", "scheduler.cpus_per_task=two"], "scheduler.cpus_per_task='two' is invalid"),
    (["scheduler=slurm", "scheduler.time=4h"], "scheduler.time='4h' is invalid: must be a Slurm time limit"),
    (["scheduler=slurm", "scheduler.partition='a b'"], "scheduler.partition='a b' is invalid"),
    (["scheduler=slurm", "scheduler.job_name=interactive"], "scheduler.job_name=interactive is invalid"),
    (["scheduler=slurm", "scheduler.extra_sbatch=['mem=0']"], "scheduler.extra_sbatch item 'mem=0' is invalid"),
    (["scheduler=slurm", "scheduler.dry_run=maybe"], "scheduler.dry_run='maybe' is invalid: must be true or false"),
    (["scheduler=slurm", "scheduler.node=2"], "scheduler.node is not a key (did you mean scheduler.nodes?)"),
    (["scheduler.nodes=2"], "scheduler.nodes is not a key of scheduler=local"),
    (["scheduler=pbs"], "scheduler=pbs is invalid: must be one of local, ray, slurm"),
    (["scheduler=slurm"], "scheduler=slurm: sbatch is not on PATH"),
    (["scheduler=slurm", "--ckpt_path", "last"], "--ckpt_path is not supported with scheduler=slurm"),
    (["scheduler=slurm", "actor.eps_clip=-1"], "actor.eps_clip=-1 is invalid: must be a finite number >= 0.0"),
])
def test_bad_settings_are_one_line_and_exit_2(args, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    assert main(["fit", "logger=none", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: " + expected), err
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_validate_is_not_submitted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "logger=none", "scheduler=slurm"]) == 2
    assert capsys.readouterr().err == "error: scheduler=slurm submits fit only: run validate here (scheduler=local)\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_job_trains_on_two_ranks_in_one_run_dir_and_is_requeued_on_sigusr1(tmp_path, monkeypatch, capsys):
    # Iterations of the job: the warning, sent once "iteration 1" is in the log, must arrive before the last
    # (a tiny iteration takes a fraction of a second, the log is read every 0.1 s).
    STEPS = 8
    bin_dir, probe = tmp_path / "bin", tmp_path / "probe"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    callbacks = ("trainer.callbacks=[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, "
                 "init_args: {save_last: true}}, {class_path: lit_ppo.callbacks.progress.IterationProgress}, "
                 f"{{class_path: tests.integration.rank_probe.RankProbe, init_args: {{out_dir: '{probe}'}}}}]")
    fast = [a for a in FAST if not a.startswith("trainer.max_steps")]
    monkeypatch.chdir(tmp_path)
    script, text, _ = dry_run(capsys, "algo=grpo", *fast, f"trainer.max_steps={STEPS}", callbacks,
                                "scheduler.nodes=2")
    run_dir = script.parent.parent
    # What sbatch and srun export to a 2-node job of one task per node; the ports of this machine.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LIT_PPO_RUN_DIR"))},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), "LIT_PPO_CACHE": str(tmp_path / "cache"),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": run_dir.name, "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "SRUN_PIDS": str(tmp_path / "pids"),
           "SCONTROL_LOG": str(tmp_path / "scontrol.log")}
    log = tmp_path / "job.log"

    def start_job() -> subprocess.Popen:
        return subprocess.Popen(["bash", str(script)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)

    job = start_job()
    wait_for_text(log, "iteration 1", job)  # training runs: Slurm's warning before the time limit arrives
    for pid in (tmp_path / "pids").read_text().split():
        os.kill(int(pid), signal.SIGUSR1)
    assert job.wait(timeout=240) == 138, log.read_text()[-3000:]
    first = log.read_text()
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped_at = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert 1 <= stopped_at < STEPS, first[-3000:]
    assert f"run directory: {run_dir.relative_to(tmp_path)}\n" in first
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in first

    # The requeued start: the same script resumes the run from last.ckpt in the same directory.
    (tmp_path / "pids").unlink()
    job = start_job()
    assert job.wait(timeout=240) == 0, log.read_text()[-3000:]
    second = log.read_text()
    assert f"Restoring states from the checkpoint path at {last}" in second
    assert f"run directory: {run_dir.relative_to(tmp_path)}\n" in second
    assert [p.name for p in run_dir.parent.iterdir()] == [run_dir.name]  # no other run was made
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == STEPS
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [STEPS, STEPS]
    assert [r["ckpt_dir"] for r in ranks] == [str(run_dir / "checkpoints")] * 2  # rank 1 learned it by broadcast
    assert ranks[0]["final"] == ranks[1]["final"]
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt"))  # Lightning's own requeue handler never ran
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"

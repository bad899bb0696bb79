"""SIGTERM / SIGINT on a real training process: the iteration finishes (or, on a second signal during
generation, is abandoned), last.ckpt holds the last completed iteration, the exit code is 128 + the
signal, the MLflow run is KILLED, and resuming ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_ppo.training.checkpoint_files import read_checkpoint

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
GROUPS = 4  # prompt groups per iteration: the probe is called once per group
ARGS = ["trainer.max_steps=6", f"data.batch_size={GROUPS}", "gconfig.n_samples=4",
        "data.dynamic_filter_fn=progress_probe.accept", "eval.max_problems=4"]
# A dynamic filter that accepts every group and records each call: the test sees how far generation
# got, and the first group of every iteration takes half a second, so a signal sent right after it
# is recorded arrives while that iteration is still generating.
PROBE = '''
import os, time

def accept(group):
    with open(os.environ["PROBE_FILE"], "a") as f:
        f.write("group\\n")
    with open(os.environ["PROBE_FILE"]) as f:
        calls = sum(1 for _ in f)
    if calls % {groups} == 1:
        time.sleep(0.5)
    return True
'''.format(groups=GROUPS)


def start(workdir: Path, cache: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "progress_probe.py").write_text(PROBE)
    full_env = {**os.environ, "LIT_PPO_CACHE": str(cache), "PYTHONPATH": str(workdir),
                "PROBE_FILE": str(workdir / "probe.txt"), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "lit_ppo", "fit", *ARGS, *extra], cwd=workdir, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def wait_for_groups(workdir: Path, proc: subprocess.Popen, count: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    probe = workdir / "probe.txt"
    while time.monotonic() < deadline:
        if probe.exists() and len(probe.read_text().splitlines()) >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {count} groups: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {count} groups within {timeout} s")


def last_checkpoint(stderr: str, workdir: Path) -> Path:
    match = re.findall(r"--ckpt_path (\S+last\.ckpt)", stderr)
    assert match, stderr[-2000:]
    return workdir / match[-1]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_state(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name in a["state_dict"]:
        assert torch.equal(a["state_dict"][name], b["state_dict"][name]), name
    for sa, sb in zip(a["optimizer_states"], b["optimizer_states"]):
        for pa, pb in zip(sa["state"].values(), sb["state"].values()):
            assert all(torch.equal(pa[k], pb[k]) for k in pa), "optimizer state differs"
    assert a["RolloutDataModule"] == b["RolloutDataModule"]  # the prompt stream position


def resume_to_the_end(work: Path, cache: Path, ckpt: Path, logger: str = "none", env: dict | None = None) -> dict:
    """Resume from ``ckpt`` in a new process until max_steps; the final last.ckpt, which is ``ckpt``:
    the resumed run continues the checkpoint's run directory."""
    code, err = finish(start(work, cache, f"logger={logger}", "--ckpt_path", str(ckpt), env=env))
    assert code == 0, err[-3000:]
    assert list(work.glob("runs/*/*/checkpoints/last.ckpt")) == [ckpt]
    return load(ckpt)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, dict]:
    """The reference: the same run, never interrupted; its final last.ckpt."""
    root = tmp_path_factory.mktemp("graceful")
    cache = root / "cache"
    proc = start(root / "straight", cache, "logger=none")
    code, err = finish(proc)
    assert code == 0, err[-3000:]
    ckpt = sorted((root / "straight" / "runs").rglob("last.ckpt"))
    assert len(ckpt) == 1
    state = load(ckpt[0])
    assert state["global_step"] == STEPS  # the final iteration is saved although 6 is no multiple of 20
    return cache, state


@pytest.mark.slow
def test_sigterm_during_asynchronous_rollouts_resumes_exactly(tmp_path):
    """k=1: the producer generates the next batch while the trainer trains. SIGTERM stops at an
    iteration boundary; last.ckpt holds the queue (or rewinds the batch in progress), and the resume
    ends with the uninterrupted run's weights, optimizer state and stream position."""
    cache = tmp_path / "cache"
    extra = ["algo=icepop", "rollout.max_head_offpolicyness=1", "logger=none"]
    code, err = finish(start(tmp_path / "straight", cache, *extra))
    assert code == 0, err[-3000:]
    (reference,) = (tmp_path / "straight" / "runs").rglob("last.ckpt")
    work = tmp_path / "run"
    proc = start(work, cache, *extra)
    wait_for_groups(work, proc, 2 * GROUPS + 1)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143 and "Traceback" not in err, err[-3000:]
    ckpt = last_checkpoint(err, work)
    assert 1 <= load(ckpt)["global_step"] < STEPS
    code, err = finish(start(work, cache, *extra, "--ckpt_path", str(ckpt)))
    assert code == 0, err[-3000:]
    assert_same_state(load(ckpt), load(reference))


@pytest.mark.slow
def test_sigterm_finishes_the_iteration_marks_the_run_killed_and_resumes_exactly(uninterrupted, tmp_path):
    cache, reference = uninterrupted
    work = tmp_path / "run"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "faults"}
    proc = start(work, cache, "logger=mlflow", env=env)
    wait_for_groups(work, proc, 2 * GROUPS + 1)  # iteration 3 is generating
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM == 143, err[-3000:]
    assert "received SIGTERM: finishing iteration 3" in err and "Traceback" not in err
    ckpt = last_checkpoint(err, work)
    assert load(ckpt)["global_step"] == 3  # the iteration in flight completed and was saved

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]

    assert_same_state(resume_to_the_end(work, cache, ckpt, "mlflow", env), reference)
    # The resume continued the killed run to its end.
    again = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
    assert [(r.info.run_id, r.info.status) for r in again] == [(runs[0].info.run_id, "FINISHED")]
    history = client.get_metric_history(runs[0].info.run_id, "rollout/reward_mean")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))  # steps are iterations


@pytest.mark.slow
def test_second_sigint_abandons_generation_and_resumes_exactly(uninterrupted, tmp_path):
    cache, reference = uninterrupted
    work = tmp_path / "run"
    proc = start(work, cache, "logger=none")
    wait_for_groups(work, proc, 2 * GROUPS + 1)  # iteration 3 is generating (its first group sleeps)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code == 128 + signal.SIGINT == 130, err[-3000:]
    assert "abandoning iteration 3" in err
    ckpt = last_checkpoint(err, work)
    state = load(ckpt)
    assert state["global_step"] == 2  # the abandoned iteration left no trace
    # The stream position is where iteration 2 ended: iteration 3's prompts are generated again.
    assert state["RolloutDataModule"]["requests"] == 2

    assert_same_state(resume_to_the_end(work, cache, ckpt), reference)


# Runs `python -m lit_ppo` with a hook that, once training reaches iteration SIGNAL_STEP, sends this
# process the SIGNALS (real signals, delivered in os.kill) as it enters SIGNAL_AT: a point between two
# lines of the training loop that no timing from outside hits reliably.
SIGNAL_AT = """
import importlib, os, signal, sys

from lightning.pytorch import Trainer

module, owner, hook = os.environ["SIGNAL_AT"].split(":")
cls = getattr(importlib.import_module(module), owner)
original = getattr(cls, hook)
sent = []

def hooked(self, *args, **kwargs):
    trainer = args[0] if args and isinstance(args[0], Trainer) else self.trainer
    at_step = trainer.state.fn == "fit" and trainer.global_step == int(os.environ["SIGNAL_STEP"])
    if at_step and not trainer.sanity_checking and not sent:
        for name in os.environ["SIGNALS"].split(","):
            sent.append(name)
            os.kill(os.getpid(), getattr(signal, name))
    return original(self, *args, **kwargs)

setattr(cls, hook, hooked)
from lit_ppo.__main__ import main

sys.exit(main(sys.argv[1:]))
"""
WEIGHT_PUSH = "lit_ppo.callbacks.weight_sync:WeightSync:on_train_batch_end"  # before the boundary's decision
PERIODIC_CHECKPOINT = "lightning.pytorch.callbacks:ModelCheckpoint:on_train_batch_end"  # after it
EVALUATION_BATCH = "lit_ppo.training.module:LitPPO:validation_step"
EVALUATION = "trainer.val_check_interval=3"  # an evaluation after iteration 3


def run_signalled(work: Path, cache: Path, at: str, signals: str, *extra: str) -> tuple[int, str]:
    """Train with ``signals`` sent at ``at`` in iteration 3; the exit code and the output."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "progress_probe.py").write_text(PROBE)
    (work / "signal_at.py").write_text(SIGNAL_AT)
    env = {**os.environ, "LIT_PPO_CACHE": str(cache), "PYTHONPATH": os.pathsep.join([str(work), str(REPO)]),
           "PROBE_FILE": str(work / "probe.txt"), "SIGNAL_AT": at, "SIGNAL_STEP": "3", "SIGNALS": signals}
    done = subprocess.run([sys.executable, "signal_at.py", "fit", *ARGS, "logger=none", *extra], cwd=work,
                          env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_sigterm_during_an_evaluation_ends_it_unscored_and_resumes_exactly(uninterrupted, tmp_path):
    cache, reference = uninterrupted
    work = tmp_path / "run"
    code, out = run_signalled(work, cache, EVALUATION_BATCH, "SIGTERM", EVALUATION)
    assert code == 143, out[-3000:]
    assert "received SIGTERM: ending the evaluation of iteration 3 unscored" in out, out[-3000:]
    # No score of part of the test split, no iteration after it, nor the evaluation a stop brings.
    assert "eval at iteration 3:" not in out and "iteration 4/6" not in out
    ckpt = last_checkpoint(out, work)
    state = load(ckpt)
    assert state["global_step"] == 3 and state["RolloutDataModule"]["requests"] == 3
    code, out = finish(start(work, cache, "logger=none", EVALUATION, "--ckpt_path", str(ckpt)))
    assert code == 0, out[-3000:]
    assert_same_state(load(ckpt), reference)  # evaluations leave training as it was


@pytest.mark.slow
def test_a_second_signal_abandons_the_evaluation(uninterrupted, tmp_path):
    cache, _ = uninterrupted
    code, out = run_signalled(tmp_path, cache, EVALUATION_BATCH, "SIGINT,SIGINT", EVALUATION)
    assert code == 130, out[-3000:]
    assert "received SIGINT again: abandoning the evaluation of iteration 3" in out, out[-3000:]
    assert "eval at iteration 3:" not in out and "iteration 4/6" not in out
    assert load(last_checkpoint(out, tmp_path))["global_step"] == 3  # the iteration before the evaluation


@pytest.mark.slow
@pytest.mark.parametrize(("at", "extra", "said", "step"), [
    (WEIGHT_PUSH, EVALUATION, "finishing iteration 3", 3),
    (PERIODIC_CHECKPOINT, EVALUATION, "skipping the evaluation of iteration 3", 3),
    (PERIODIC_CHECKPOINT, "trainer.val_check_interval=20", "finishing iteration 4", 4),
], ids=["before-the-boundary", "evaluation-next", "iteration-next"])
def test_a_signal_at_an_iteration_boundary_says_what_it_stops(uninterrupted, tmp_path, at, extra, said, step):
    """Between an iteration's update and the next thing the loop does, the line printed is what happens."""
    cache, _ = uninterrupted
    code, out = run_signalled(tmp_path, cache, at, "SIGTERM", extra)
    assert code == 143, out[-3000:]
    assert f"received SIGTERM: {said}, then writing last.ckpt" in out, out[-3000:]
    assert f"stopped by SIGTERM after iteration {step};" in out and f"iteration {step + 1}/6" not in out
    assert re.findall(r"eval at iteration \d+", out) == ["eval at iteration 0"]  # the untrained scores only
    assert load(last_checkpoint(out, tmp_path))["global_step"] == step


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_sigterm_to_rank_zero_stops_both_ranks_at_one_boundary(uninterrupted, tmp_path, trainer):
    cache, _ = uninterrupted
    work = tmp_path / "run"
    proc = start(work, cache, "logger=none", f"trainer={trainer}")
    wait_for_groups(work, proc, 2 * 2 * GROUPS + 1)  # both ranks record their groups: iteration 3 runs
    proc.send_signal(signal.SIGTERM)  # rank 0 only, as `kill <pid>` or `docker stop` would
    code, err = finish(proc)
    assert code == 143, err[-3000:]
    # A verified checkpoint (a file under DDP, a distributed directory under FSDP) of iteration 3.
    assert read_checkpoint(str(last_checkpoint(err, work)))["global_step"] == 3
    # Rank 1 (Lightning's child process, same working directory) ended too instead of waiting in a collective.
    assert not processes_in(work)


def processes_in(workdir: Path) -> list[int]:
    """Pids of live processes whose working directory is ``workdir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == workdir:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids

"""``fit --ckpt_path`` continues the run it names, through the CLI's entry point (each fit in this process, as
the process ends between them; a second process resumes the Python API's run): the run's recorded config with
each change named (those its checkpoint cannot follow refused, a new learning rate applied), a new run
directory for a checkpoint that branches from its run, ``--ckpt_path last``, a leftover job directory, and the
Python API's lock and reward functions defined again."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import run_cli, run_here

# Not the presets' batch size (32), group size (16), evaluation or tracking: a resume that took the
# presets' values instead of the run's would show.
RUN = ["logger=none", "data.batch_size=4", "gconfig.n_samples=4", "eval.max_problems=4"]


@pytest.fixture
def fit(tmp_path, monkeypatch, capfd):
    """``python -m lit_ppo fit <args>`` in ``tmp_path`` (``run_here``), asserting its exit code."""
    def call(*args: str, code: int = 0, env: dict | None = None) -> subprocess.CompletedProcess:
        result = run_here(["fit", *args], tmp_path, monkeypatch, capfd, env=env)
        assert result.returncode == code, result.stderr[-3000:]
        return result

    return call


def notes(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("note: ")]


def only_run(cwd: Path) -> Path:
    (run_dir,) = (cwd / "runs" / "lit_ppo").iterdir()
    return run_dir


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_resume_without_overrides_continues_the_recorded_config_and_applies_a_new_lr(tmp_path, fit):
    fit(*RUN, "trainer.max_steps=2")
    run_dir = only_run(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"

    resumed = fit("trainer.max_steps=4", "--ckpt_path", str(last))
    assert notes(resumed) == ["note: resuming with trainer.max_steps=4 (the run had 2)"]
    (config,) = run_dir.glob("config-resumed-*.yaml")
    data = yaml.safe_load(config.read_text())["data"]
    assert (data["batch_size"], data["gconfig"]["n_samples"], data["eval"]["max_problems"]) == (4, 4, 4)
    assert not (tmp_path / "mlflow.db").exists()  # the run's logger=none, not the presets' MLflow
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 4
    assert [p["lr"] for p in checkpoint["optimizer_states"][0]["param_groups"]] == [1e-3]
    assert list((tmp_path / "runs" / "lit_ppo").iterdir()) == [run_dir]

    # A new learning rate reaches the restored optimizer and its schedule.
    fit("actor.optimizer.lr=0.5", "trainer.max_steps=5", "--ckpt_path", str(last))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 5
    assert [p["lr"] for p in checkpoint["optimizer_states"][0]["param_groups"]] == [0.5]
    assert checkpoint["lr_schedulers"][0]["base_lrs"] == [0.5]

    # What the checkpoint's state was made with cannot change: one line, exit code 2, nothing written.
    before = digest(last)
    refused = fit("gconfig.n_samples=8", "trainer.max_steps=6", "--ckpt_path", str(last), code=2)
    assert refused.stderr.startswith(f"error: gconfig.n_samples=8 cannot change when resuming --ckpt_path {last} "
                                     f"(the run had 4): ") and refused.stderr.count("\n") == 1, refused.stderr
    assert digest(last) == before

    # At its trainer.max_steps already: nothing trains, and the summary says so; the run's files stay.
    written = {path: digest(path) for path in [last, run_dir / "summary.txt", run_dir / "model" / "model.safetensors"]}
    again = fit("--ckpt_path", "last")
    assert notes(again) == []
    assert "  iterations     5 of 5 (none trained: trainer.max_steps=5 was reached already)\n" in again.stdout
    assert {path: digest(path) for path in written} == written
    assert (run_dir / "summary.txt").read_text().startswith("run summary\n  iterations     5 of 5 (1 in ")


@pytest.mark.slow
def test_an_older_or_copied_checkpoint_branches_into_a_new_run(tmp_path, fit):
    import mlflow

    store = tmp_path / "mlflow.db"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    tracked = [arg for arg in RUN if arg != "logger=none"]
    fit(*tracked, "trainer.max_steps=4", "checkpoint.every_n_iterations=2", env=env)
    run_dir = only_run(tmp_path)
    kept = {path: digest(path) for path in [run_dir / "checkpoints" / "last.ckpt", run_dir / "summary.txt",
                                            *(run_dir / "model").iterdir()]}
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    (original,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])

    older = run_dir / "checkpoints" / "epoch=0-step=2.ckpt"
    branch = fit("--ckpt_path", str(older), env=env)
    branch_dir = next(d for d in (tmp_path / "runs" / "lit_ppo").iterdir() if d != run_dir)
    assert notes(branch) == [f"note: --ckpt_path {older} branches from iteration 2 of "
                             f"{run_dir.relative_to(tmp_path)} (which has gone on to iteration 4): new run "
                             f"directory {branch_dir.relative_to(tmp_path)}"]
    assert torch.load(branch_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    assert {path: digest(path) for path in kept} == kept  # the run itself is as it was
    history = client.get_metric_history(original.info.run_id, "rollout/reward_mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # nothing twice
    runs = client.search_runs([original.info.experiment_id])
    (new,) = [run for run in runs if run.info.run_id != original.info.run_id]
    assert new.data.tags["run_dir"] == str(branch_dir.resolve())
    assert sorted(m.step for m in client.get_metric_history(new.info.run_id, "rollout/reward_mean")) == [3, 4]

    # A copy of a run directory is not the run: resuming it starts another.
    copy = tmp_path / "copy"
    copy_last = copy / "checkpoints" / "last.ckpt"
    import shutil

    shutil.copytree(run_dir, copy)
    moved = fit("trainer.max_steps=5", "--ckpt_path", str(copy_last), env=env)
    assert any(note.startswith(f"note: --ckpt_path {copy_last} branches from iteration 4 of "
                               f"{run_dir.relative_to(tmp_path)} (it lies outside that directory): new run directory ")
               for note in notes(moved)), moved.stderr[-3000:]
    assert {path: digest(path) for path in kept} == kept
    assert len(list((tmp_path / "runs" / "lit_ppo").iterdir())) == 3


def test_ckpt_path_last_without_a_run_is_refused(tmp_path, fit):
    result = fit(*RUN, "--ckpt_path", "last", code=2)
    assert result.stderr == (f"error: --ckpt_path last: no run directory {tmp_path}/runs/lit_ppo/grpo-arithmetic-tiny"
                             f"-<time> holds a checkpoints/last.ckpt: give the path of the checkpoint to resume\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_leftover_job_run_dir_does_not_send_a_fresh_fit_into_its_run(tmp_path, fit):
    fit(*RUN, "trainer.max_steps=1")
    run_dir = only_run(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    before = digest(last)
    fresh = fit(*RUN, "trainer.max_steps=1", env={"LIT_PPO_JOB_RUN_DIR": str(run_dir)})
    assert notes(fresh) == [f"note: LIT_PPO_JOB_RUN_DIR={run_dir} is not this process's job directory (it holds "
                            f"another run): starting a new run"]
    assert len(list(run_dir.parent.iterdir())) == 2 and digest(last) == before


NOTEBOOK = """
import sys
import lit_ppo
from lit_ppo.errors import ConfigError

RUN = {run}
plain = lit_ppo.fit(lit_ppo.compose(*RUN, "trainer.max_steps=1"))
print("plain", plain.checkpoint, flush=True)

DATASET = ["data=dataset", "data.task_kwargs.train_path=train.jsonl", "gconfig.max_new_tokens=2", *RUN]

def correct(prompts, completions, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

first = lit_ppo.fit(lit_ppo.compose(*DATASET, values={{"data.task_kwargs.reward_fns": [correct],
                                                       "trainer.max_steps": 1}}))

def correct(prompts, completions, answer, **columns):  # the notebook cell run again
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

try:
    second = lit_ppo.fit(lit_ppo.compose(*DATASET, values={{"data.task_kwargs.reward_fns": [correct],
                                                            "trainer.max_steps": 2}}), ckpt_path=first.checkpoint)
    print("resumed", second.run_dir == first.run_dir, flush=True)
except ConfigError as error:
    print("resumed", str(error).replace(" ", "_"), flush=True)
sys.stdin.readline()  # the kernel stays alive, its runs done
"""


@pytest.mark.slow
def test_the_python_api_releases_its_run_and_knows_a_redefined_reward(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(f'{{"prompt": "{i}=", "answer": "{i}"}}\n' for i in range(4)))
    (tmp_path / "notebook.py").write_text(NOTEBOOK.format(run=RUN))
    env = {**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")}
    log = tmp_path / "stderr.log"
    kernel = subprocess.Popen([sys.executable, "notebook.py"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env)
    try:
        said = {}
        for line in kernel.stdout:  # its own lines among the runs' progress and summaries
            if line.startswith(("plain ", "resumed ")):
                said.update([line.split()])
            if "resumed" in said:
                break
        # A second process resumes the first run while the process that trained it is still alive.
        checkpoint = Path(said["plain"])
        assert kernel.poll() is None
        resumed = run_cli(["fit", "trainer.max_steps=2", "--ckpt_path", str(checkpoint)], tmp_path)
        assert (resumed.returncode, resumed.stderr.splitlines()[-1:]) == (0, ["`Trainer.fit` stopped: `max_steps=2` "
                                                                              "reached."]), resumed.stderr[-3000:]
        assert torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"] == 2
        # The reward function defined again is the one the run was trained with: its resume continues it.
        assert said["resumed"] == "True", said["resumed"]
    finally:
        kernel.communicate("\n", timeout=60)


@pytest.mark.slow
def test_a_resume_from_a_config_file_names_each_change_once(tmp_path, fit):
    fit(*RUN, "trainer.max_steps=1")
    run_dir = only_run(tmp_path)
    given = yaml.safe_load((run_dir / "config.yaml").read_text())
    given["trainer"]["max_steps"] = 2
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(given, sort_keys=False))

    resumed = fit("--config", str(tmp_path / "run.yaml"), "--ckpt_path", str(run_dir / "checkpoints" /
                                                                                       "last.ckpt"))
    assert notes(resumed) == ["note: resuming with trainer.max_steps=2 (the run had 1)"]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 2

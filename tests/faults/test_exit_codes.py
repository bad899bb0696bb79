"""Exit codes that tell the truth: a signal stops every subcommand with 128 + its number and one line
(validate and test included, before the first iteration of a fit included, with its MLflow run
KILLED), and a user function that calls sys.exit() fails the run, naming the function."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_ppo.__main__ import main
from tests.integration.conftest import wait_for_text

# The tiny model on the smallest batch: the cost is start-up.
TINY = ["trainer.max_steps=3", "data.batch_size=2", "gconfig.n_samples=2", "trainer.enable_progress_bar=false",
        "eval.max_problems=4"]
PROBE = '''
import os, sys, time

from lit_ppo.tasks.arithmetic import ArithmeticTask


def mark(text):
    with open(os.environ["PROBE_FILE"], "a") as f:
        f.write(text + "\\n")


class SlowStart(ArithmeticTask):
    """Holds a fit after its MLflow run exists and before its first iteration (on_fit_start asks the
    task for its allowed tokens)."""

    def allowed_completion_tokens(self, tokenizer):
        mark("starting")
        time.sleep(120)
        return super().allowed_completion_tokens(tokenizer)


class SlowScoring(ArithmeticTask):
    """Scores slowly, so that a signal lands while the test split is scored."""

    def reward(self, problem, completion):
        mark("scoring")
        time.sleep(0.2)
        return super().reward(problem, completion)


def exits_on_third_call(prompts, completions, answer, **columns):
    """A reward that ends the process the way a script's guard would."""
    mark("reward")
    with open(os.environ["PROBE_FILE"]) as f:
        if sum(1 for _ in f) == 3:
            sys.exit()
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
'''


def start(work: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    work.mkdir(parents=True, exist_ok=True)
    (work / "probe.py").write_text(PROBE)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LIT_PPO_"))}
    full_env.update({"LIT_PPO_CACHE": str(work / "cache"), "PYTHONPATH": str(work),
                     "PROBE_FILE": str(work / "probe.txt"), **(env or {})})
    return subprocess.Popen([sys.executable, "-m", "lit_ppo", *args], cwd=work, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_validate_exits_with_its_code_and_no_scores(tmp_path, signum):
    proc = start(tmp_path, "validate", "data.task=probe.SlowScoring", "eval.max_problems=16", "eval.k=1")
    wait_for_text(tmp_path / "probe.txt", "scoring", proc, timeout=240)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert error_lines(err) == [f"error: stopped by {signal.Signals(signum).name} during validate: no scores"], err
    assert "Traceback" not in err and "accuracy" not in out


@pytest.mark.slow
def test_sigterm_before_the_first_iteration_marks_the_mlflow_run_killed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = start(tmp_path, "fit", *TINY, "data.task=probe.SlowStart",
                 env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "early"})
    wait_for_text(tmp_path / "probe.txt", "starting", proc, timeout=240)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert error_lines(err) == ["error: stopped by SIGTERM before the first iteration: nothing was trained"], err
    assert "Traceback" not in err

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("early").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]


@pytest.mark.slow
def test_sys_exit_in_a_reward_function_fails_the_run_naming_it_and_keeps_the_last_iteration(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)} for a in range(10) for b in range(3)]
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # batch_size 2: one reward call per group, so the third call is in the second iteration.
    proc = start(tmp_path, "fit", *TINY, "logger=none", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                 "data.task_kwargs.reward_fns=[probe.exits_on_third_call]", "gconfig.max_new_tokens=4")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (line,) = error_lines(err)
    assert line.startswith("error: probe.exits_on_third_call (probe.py:"), line
    assert "called sys.exit() during iteration 2: exiting from user code fails the run" in line
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 1
    assert "last.ckpt holds iteration 1" in err


def test_argparse_exiting_in_user_code_is_blamed_on_the_user_function(tmp_path):
    """argparse's exit is inside the standard library: the user's function that called it is named."""
    from lit_ppo.launch.user_exit import exiting_function, user_exit_message

    module = tmp_path / "user_script.py"
    module.write_text("import argparse\n\n\ndef parse_options():\n"
                      "    return argparse.ArgumentParser(prog='x').parse_args(['--nope'])\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import user_script

        with pytest.raises(SystemExit) as caught:
            with open(os.devnull, "w") as quiet:
                stderr, sys.stderr = sys.stderr, quiet
                try:
                    user_script.parse_options()
                finally:
                    sys.stderr = stderr
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_script", None)
    assert exiting_function(caught.value) == "user_script.parse_options (user_script.py:5)"
    assert user_exit_message(caught.value, "during iteration 4") == (
        "user_script.parse_options (user_script.py:5) called sys.exit(2) during iteration 4: exiting from user "
        "code fails the run")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_every_subcommand_exits_with_the_signal_code(monkeypatch, capfd, signum):
    """A subcommand without signal handling of its own (compare here) still ends with 128 + the signal
    and one line: the signal is real, delivered to this process while the subcommand runs."""
    import lit_ppo.cli.compare

    def busy(argv):
        os.kill(os.getpid(), signum)
        time.sleep(5)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(lit_ppo.cli.compare, "main", busy)  # what lit_ppo.cli.main runs for compare
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    assert main(["compare"]) == 128 + signum
    assert capfd.readouterr().err == f"error: stopped by {signal.Signals(signum).name} during compare: no table\n"
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are put back

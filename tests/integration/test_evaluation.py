"""Evaluation through the CLI: eval/* metrics during fit (in MLflow and on stdout), and the
``validate`` / ``test`` subcommands, on the shared demo run (tests/integration/conftest.py)."""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.conftest import run_cli

pytestmark = pytest.mark.slow
EVAL_KEYS = ("eval/accuracy", "eval/pass_at_4", "eval/mean_at_4", "eval/reward_mean", "eval/response_length",
             "eval/problems")


def printed_scores(stdout: str) -> dict[str, float]:
    """The eval/* rows of the results table that Lightning prints for validate / test."""
    return {key: float(value) for key, value in re.findall(r"(eval/\w+)\W+?(-?[0-9][0-9.eE+-]*)", stdout)}


def mlflow_history(demo_run) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(demo_run.env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                     key=lambda m: m.step)] for key in EVAL_KEYS}


def test_fit_scores_the_test_split_before_training_every_20_iterations_and_at_the_end(demo_run):
    history = mlflow_history(demo_run)
    # eval.before_training at iteration 0; trainer.val_check_interval=20 of the cpu preset; iteration 100 is both a
    # check and the end: once.
    steps = [step for step, _ in history["eval/accuracy"]]
    assert steps == [0, 20, 40, 60, 80, 100], steps  # MLflow's steps are the iterations as printed
    assert all(history[key] and [s for s, _ in history[key]] == steps for key in EVAL_KEYS)
    assert all(value == 200 for _, value in history["eval/problems"])  # the arithmetic test split, whole
    # One plain line per evaluation on a non-terminal stdout.
    lines = re.findall(r"^eval at iteration (\d+): accuracy ([0-9.]+) ", demo_run.stdout, re.M)
    assert [int(i) for i, _ in lines] == [0, 20, 40, 60, 80, 100], demo_run.stdout[-2000:]
    assert demo_run.stdout.index("eval at iteration 0:") < demo_run.stdout.index("iteration 1/100 ")
    for (_, printed), (_, logged) in zip(lines, history["eval/accuracy"]):
        assert float(printed) == pytest.approx(logged, abs=5e-3)


def test_trained_accuracy_is_far_above_the_untrained_model(demo_run, tmp_path):
    untrained = run_cli(["validate", "logger=none"], tmp_path, timeout=300)  # the same config, no checkpoint
    assert untrained.returncode == 0, untrained.stderr[-3000:]
    before = printed_scores(untrained.stdout)["eval/accuracy"]
    # The fit's own score at iteration 0 is the untrained model's: the same problems, seeds and engine.
    history = mlflow_history(demo_run)
    assert {key: values[0] for key, values in history.items()} == {
        key: (0, pytest.approx(value, abs=1e-6)) for key, value in printed_scores(untrained.stdout).items()
        if key in history}
    after = history["eval/accuracy"][-1][1]
    assert before < 0.2 and after > 0.8 and after - before > 0.6, (before, after)
    # pass@k >= accuracy of one sample on average (mean@k), by definition.
    final = {key: values[-1][1] for key, values in mlflow_history(demo_run).items()}
    assert final["eval/pass_at_4"] >= final["eval/mean_at_4"]


@pytest.mark.parametrize("subcommand, title", [("validate", "Validate metric"), ("test", "Test metric")])
def test_validate_and_test_reproduce_the_final_eval_from_the_checkpoint_alone(demo_run, tmp_path, subcommand, title):
    # Only the checkpoint: its config travels in it (run from another directory, nothing else given).
    ckpt = demo_run.dir / "checkpoints" / "last.ckpt"
    result = run_cli([subcommand, "--ckpt_path", str(ckpt)], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert title in result.stdout
    printed = printed_scores(result.stdout)
    final = {key: values[-1][1] for key, values in mlflow_history(demo_run).items()}
    assert printed.keys() == final.keys()
    for key, value in final.items():  # the same problems, seeds and weights: the same scores
        assert printed[key] == pytest.approx(value, abs=1e-6), key
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()  # nothing recorded


def test_validate_overrides_change_the_scoring(demo_run, tmp_path):
    ckpt = demo_run.dir / "checkpoints" / "last.ckpt"
    result = run_cli(["validate", "--ckpt_path", str(ckpt), "eval.k=0", "eval.max_problems=10"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = printed_scores(result.stdout)
    assert printed["eval/problems"] == 10 and "eval/pass_at_4" not in printed


@pytest.mark.parametrize("args, message", [
    (["rollout=vllm"], "validate --ckpt_path uses the checkpoint's own config: rollout=vllm cannot change it"),
    (["evaluation.k=2"], "evaluation.k is not a key: must start with one of"),
    (["eval.k=-1"], "eval.k=-1 is invalid: must be an integer >= 0"),
])
def test_validate_bad_overrides_are_one_line(demo_run, tmp_path, monkeypatch, capsys, args, message):
    ckpt = demo_run.dir / "checkpoints" / "last.ckpt"
    command = ["validate", "--ckpt_path", str(ckpt), *args]
    if args == ["rollout=vllm"]:  # one of them in a real process: its exit code and stderr as a user sees them
        result = run_cli(command, tmp_path)
        code, err = result.returncode, result.stderr
    else:  # the others through the same entry point in this process (python -m lit_ppo is main)
        from lit_ppo.__main__ import main

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
        code, err = main(command), capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert "Traceback" not in err and not (tmp_path / "cache").exists()  # refused before any model loaded

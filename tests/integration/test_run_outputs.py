"""What a finished fit leaves besides its model: the sample completions (a file in the run directory and an
MLflow table) and the summary block that ends it, on the shared demo run (tests/integration/conftest.py),
checked against the task's rule and MLflow's record read back independently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import pytest

pytestmark = pytest.mark.slow


def _answer(prompt: str) -> str:
    """The default task's answer, from its rule: ``a+b=`` -> (a + b) mod 10."""
    a, b = re.fullmatch(r"(\d)\+(\d)=", prompt).groups()
    return str((int(a) + int(b)) % 10)


def _run(demo_run):
    client = mlflow.MlflowClient(demo_run.env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
    return client, run


def test_samples_go_to_the_run_directory_and_to_an_mlflow_table(demo_run, tmp_path):
    rows = [json.loads(line) for line in (demo_run.dir / "samples.jsonl").read_text().splitlines()]
    # CompletionSamples(every_n_steps=10, num_samples=8) over 100 iterations: iterations 1, 11, ..., 91.
    assert [row["iteration"] for row in rows] == [i for i in range(1, 101, 10) for _ in range(8)]
    for row in rows:
        expected = 1.0 if row["completion"].strip() == _answer(row["prompt"]) else (
            0.1 if re.fullmatch(r"[0-9]", row["completion"].strip()) else 0.0)
        assert row["reward"] == pytest.approx(expected), row
    assert {row["reward"] for row in rows[-8:]} != {0.0}  # the trained policy gets some right
    client, run = _run(demo_run)
    tables = Path(client.download_artifacts(run.info.run_id, "samples", str(tmp_path)))
    logged = [dict(zip(table["columns"], values)) for path in sorted(tables.iterdir())
              for table in [json.loads(path.read_text())] for values in table["data"]]
    assert [{**row, "reward": pytest.approx(row["reward"], rel=1e-8)} for row in rows] == logged  # JSON's 10 digits


def test_a_fit_ends_with_a_summary_that_matches_the_record(demo_run, tmp_path):
    lines = demo_run.stdout.splitlines()
    block = lines[lines.index("run summary"):]
    summary = dict(re.fullmatch(r"  (\S+(?: \S+)?)\s{2,}(.*)", line).groups() for line in block[1:])
    client, run = _run(demo_run)
    rewards = sorted(client.get_metric_history(run.info.run_id, "rollout/reward_mean"), key=lambda m: m.step)
    assert [m.step for m in rewards] == list(range(1, 101))  # MLflow's steps are the iterations as printed
    assert summary["iterations"].startswith("100 of 100 (100 in ")
    assert summary["reward"] == (f"{rewards[0].value:.3g} (iteration 1) -> {rewards[-1].value:.3g} "
                                 f"(iteration 100)")
    accuracy = sorted(client.get_metric_history(run.info.run_id, "eval/accuracy"), key=lambda m: m.step)[-1]
    assert summary["eval"].startswith(f"accuracy {accuracy.value:.3g}, ") and summary["eval"].endswith(
        "(iteration 100)")
    checkpoint = demo_run.cwd / summary["checkpoint"]
    assert demo_run.cwd / summary["run directory"] == demo_run.dir
    assert checkpoint == demo_run.dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file() and (demo_run.cwd / summary["model"].split(" ")[0] / "config.json").is_file()
    assert summary["mlflow run"].startswith(f"{run.info.run_id} in {demo_run.env['MLFLOW_TRACKING_URI']}")
    assert "resume" not in summary  # the run is complete
    assert summary["test scores"] == f"python -m lit_ppo validate --ckpt_path {summary['checkpoint']}"
    assert summary["export"] == f"python -m lit_ppo export --ckpt_path {summary['checkpoint']} --output my-policy"
    logged = client.download_artifacts(run.info.run_id, "summary.txt", str(tmp_path))
    assert open(logged).read() == "\n".join(block) + "\n"

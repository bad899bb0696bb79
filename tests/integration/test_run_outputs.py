"""What a finished fit leaves besides its model: the sample completions (a file in the run directory and an
MLflow table) and the summary block that ends it, on the shared demo run (tests/integration/conftest.py),
checked against the task's rule and MLflow's record read back independently; the commands a summary
prints, each run as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import mlflow
import pytest

from .conftest import FAST

pytestmark = pytest.mark.slow


def _answer(prompt: str) -> str:
    """The default task's answer, from its rule: ``a+b=`` -> (a + b) mod 10."""
    a, b = re.fullmatch(r"(\d)\+(\d)=", prompt).groups()
    return str((int(a) + int(b)) % 10)


def _summary(stdout: str) -> dict[str, str]:
    """The rows of the summary block that ends ``stdout``: label -> value."""
    lines = stdout.splitlines()
    return dict(re.fullmatch(r"  (\S+(?: \S+)?)\s{2,}(.*)", line).groups()
                for line in lines[lines.index("run summary") + 1:])


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


def test_the_commands_a_summary_prints_run_as_printed(cli_here):
    # Stopped by trainer.max_time long before trainer.max_steps: a run to resume, with a test split to score.
    fast = [arg for arg in FAST if not arg.startswith("trainer.max_steps=")]
    stopped = cli_here("fit", *fast, "trainer.max_steps=100", "trainer.max_time='00:00:00:01'")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    summary = _summary(stopped.stdout)
    ckpt = summary["checkpoint"]
    assert re.fullmatch(r"\d+ of 100 \(.*\)", summary["iterations"]) and not summary["iterations"].startswith("100")
    commands = {label: summary[label] for label in ("resume", "test scores", "export")}
    assert commands == {"resume": f"python -m lit_ppo fit --ckpt_path {ckpt}",
                        "test scores": f"python -m lit_ppo validate --ckpt_path {ckpt}",
                        "export": f"python -m lit_ppo export --ckpt_path {ckpt} --output my-policy"}
    results = {}
    for label, command in commands.items():  # in the directory the run was started from, as a user would
        results[label] = cli_here(*shlex.split(command)[3:])  # after "python -m lit_ppo"
        assert results[label].returncode == 0, (label, results[label].stderr[-3000:])
    assert "eval/accuracy" in results["test scores"].stdout
    assert (cli_here.cwd / "my-policy" / "config.json").is_file()


def test_a_summary_offers_no_test_scores_to_a_run_without_test_problems(cli_here):
    fast = [arg for arg in FAST if not arg.startswith("eval.max_problems=")]
    finished = cli_here("fit", *fast, "eval.max_problems=0")
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = _summary(finished.stdout)
    assert "test scores" not in summary and "resume" not in summary  # nothing to score, nothing left to train
    assert summary["export"] == f"python -m lit_ppo export --ckpt_path {summary['checkpoint']} --output my-policy"
    # What the summary does not offer would be refused.
    refused = cli_here("validate", "--ckpt_path", summary["checkpoint"])
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("error: validate: task 'arithmetic' has no test problems to score "
                                             "(eval.max_problems=0;")

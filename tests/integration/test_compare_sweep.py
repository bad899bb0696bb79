"""``python -m lit_ppo sweep`` and ``compare`` on tiny runs: the one real sweep of this module (2 fits of
2 iterations, tracked in a sqlite store) is checked against MLflow read back independently, and
the compare tests read its runs; the order of a 2 x 2 grid, and bad input, are checked in-process
(exit 2, one line)."""

from __future__ import annotations

import re
import signal
from types import SimpleNamespace

import pytest

from tests.integration.conftest import FAST, run_cli

# FAST minus logger=none (these runs log to MLflow), two prompts x two samples per iteration.
TRACKED = [arg for arg in FAST if not arg.startswith(("logger=", "data.batch_size=", "gconfig.n_samples="))] + [
    "data.batch_size=2", "gconfig.n_samples=2"]
MAX_STEPS = int(next(arg.split("=")[1] for arg in FAST if arg.startswith("trainer.max_steps=")))
COLUMNS = ["run", "id", "algo", "seed", "iterations", "final reward", "best reward", "eval accuracy", "it/s", "kl",
           "approx_kl", "clip fraction", "entropy"]


def table(stdout: str) -> dict[str, dict[str, str]]:
    """``{run name: {column: cell}}`` of the compare table in ``stdout`` (a sweep's holds each fit's run
    summary before it, whose first line starts with ``run`` too)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.split(r"\s{2,}", line.strip())[:2] == COLUMNS[:2])
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 2:]:
        if line.startswith("figure of"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def history(client, run_id: str, metric: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A README-style sweep of 2-iteration fits into experiment 'grid': ``algo=grpo,rloo`` and the one-value
    sweep ``seed=choice(1)``, so that the table has a swept column besides algo at the cost of two fits
    (the order of a larger grid is checked in-process, ``test_sweep_runs_the_grid_in_order``)."""
    import mlflow

    cwd = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{cwd}/mlflow.db"
    env = {"MLFLOW_TRACKING_URI": uri}
    result = run_cli(["sweep", "algo=grpo,rloo", "seed=choice(1)", *TRACKED, "--experiment", "grid"], cwd,
                     timeout=600, env=env)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("grid")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return SimpleNamespace(cwd=cwd, uri=uri, result=result, client=client, runs=runs)


@pytest.mark.slow
def test_sweep_runs_every_combination_into_one_experiment(swept):
    assert swept.result.returncode == 0, swept.result.stderr[-3000:]
    progress = [line for line in swept.result.stdout.splitlines() if line.startswith("[")]
    assert progress == ["[1/2] fit algo=grpo seed=1", "[2/2] fit algo=rloo seed=1"]
    assert len(swept.runs) == 2
    assert sorted((r.data.params["algo"], r.data.params["seed"]) for r in swept.runs) == [("grpo", "1"), ("rloo", "1")]
    assert all(r.data.tags["algo"] == r.data.params["algo"] and r.info.status == "FINISHED" for r in swept.runs)
    assert (swept.cwd / "grid.png").stat().st_size > 10_000


@pytest.mark.slow
def test_sweep_table_holds_the_values_mlflow_recorded(swept):
    rows = table(swept.result.stdout)
    assert sorted(rows) == sorted(r.info.run_name for r in swept.runs)
    for run in swept.runs:
        row, run_id = rows[run.info.run_name], run.info.run_id
        assert list(row) == COLUMNS and row["id"] == run_id[:8]
        rewards = history(swept.client, run_id, "rollout/reward_mean")
        assert len(rewards) == MAX_STEPS and int(row["iterations"]) == MAX_STEPS
        assert float(row["final reward"]) == pytest.approx(rewards[-1], rel=1e-3)
        assert float(row["best reward"]) == pytest.approx(max(rewards), rel=1e-3)
        assert float(row["eval accuracy"]) == pytest.approx(history(swept.client, run_id, "eval/accuracy")[-1],
                                                            abs=1e-3)
        # eval.before_training: the untrained policy's scores at iteration 0, then the final evaluation's.
        evaluated = sorted(m.step for m in swept.client.get_metric_history(run_id, "eval/accuracy"))
        assert evaluated == [0, MAX_STEPS]
        for column, metric in (("approx_kl", "actor/approx_kl"), ("clip fraction", "actor/clip_fraction"),
                               ("entropy", "actor/entropy")):
            assert float(row[column]) == pytest.approx(history(swept.client, run_id, metric)[-1], rel=1e-3)
        assert row["kl"] == "-"  # no reference model: no KL to it
        assert float(row["it/s"]) > 0
        assert (row["algo"], row["seed"]) == (run.data.params["algo"], run.data.params["seed"])


@pytest.mark.slow
def test_compare_prints_the_experiment_and_draws_the_metric(swept, monkeypatch, capsys):
    from matplotlib.image import imread

    from lit_ppo.__main__ import main  # in-process: the sweep already ran compare from the real CLI

    (swept.cwd / "plots").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", swept.uri)
    monkeypatch.chdir(swept.cwd)
    assert main(["compare", "--experiment", "grid", "--metric", "actor/entropy", "--output", "plots/entropy.png"]) == 0
    stdout = capsys.readouterr().out
    rows = table(stdout)
    names = sorted(swept.runs, key=lambda r: r.info.start_time)
    assert list(rows) == [r.info.run_name for r in names]  # in start order
    for run in swept.runs:
        assert float(rows[run.info.run_name]["final reward"]) == pytest.approx(
            history(swept.client, run.info.run_id, "rollout/reward_mean")[-1], rel=1e-3)
    assert "figure of actor/entropy: plots/entropy.png" in stdout
    image = imread(swept.cwd / "plots" / "entropy.png")
    assert image.shape == (500, 1200, 4)  # figsize 12 x 5 inches at 100 dpi, RGBA
    assert image[..., :3].std() > 0.05  # drawn, not blank


@pytest.mark.slow
def test_compare_runs_selects_exactly_those_runs(swept, monkeypatch, capsys, tmp_path):
    from lit_ppo.cli.compare import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", swept.uri)
    chosen = swept.runs[:1]  # one of the two
    assert main(["compare", "--runs", *(r.info.run_id for r in chosen), "--output", str(tmp_path / "two.png")]) == 0
    assert sorted(table(capsys.readouterr().out)) == sorted(r.info.run_name for r in chosen)
    assert (tmp_path / "two.png").stat().st_size > 10_000


@pytest.mark.slow
def test_compare_runs_takes_the_id_the_table_shows(swept, monkeypatch, capsys, tmp_path):
    from lit_ppo.cli.compare import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", swept.uri)
    run = swept.runs[1]
    assert main(["compare", "--runs", run.info.run_id[:8], "--output", str(tmp_path / "one.png")]) == 0
    rows = table(capsys.readouterr().out)
    assert list(rows) == [run.info.run_name] and rows[run.info.run_name]["id"] == run.info.run_id[:8]


def test_a_run_id_prefix_names_one_run_or_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    import mlflow

    from lit_ppo.cli.compare import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("prefixes")
    ids = [client.create_run(experiment).info.run_id for _ in range(17)]  # 17 ids, 16 hex digits: two share one
    shared = next(i[0] for i in ids if sum(other[0] == i[0] for other in ids) > 1)
    unique = next((i[:6] for i in ids if sum(other.startswith(i[:6]) for other in ids) == 1))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # the store's creation notes
    assert main(["compare", "--runs", shared]) == 2
    err = capsys.readouterr().err
    matching = sum(i.startswith(shared) for i in ids)
    assert err.count("\n") == 1 and f"--runs {shared}: the prefix matches {matching} runs (" in err, err
    assert main(["compare", "--runs", "zz"]) == 2  # no run id holds a z
    assert f"--runs zz: no such run in {uri}" in capsys.readouterr().err
    from lit_ppo.run.compare import _run_named

    assert _run_named(client, unique, None).info.run_id.startswith(unique)
    assert _run_named(client, unique.upper(), None).info.run_id.startswith(unique)  # ids are hex: case is no matter


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--experiment", "nope"], "--experiment nope: no such experiment in sqlite:"),
    (["--runs", "0123abc"], "--runs 0123abc: no such run"),
    (["--experiment", "empty"], "--experiment empty: the experiment has no runs"),
    (["--experiment", "grid", "--metric", "rollout/nope"],
     "--metric rollout/nope: no selected run logged it; logged: "),
    (["--experiment", "grid", "--bogus"], "unrecognized arguments: --bogus"),
    (["--experiment", "grid", "--metric"], "argument --metric: expected one argument"),
    (["--experiment", "grid", "--output", "out.svg"], "--output out.svg: must be a .png file"),
])
def test_compare_bad_input_is_one_line(swept, monkeypatch, capsys, tmp_path, args, message):
    from lit_ppo.cli.compare import main

    if swept.client.get_experiment_by_name("empty") is None:
        swept.client.create_experiment("empty")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", swept.uri)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    if "nope" in args:
        assert "grid" in err.split("existing: ")[1]
    if "rollout/nope" in args:
        assert "rollout/reward_mean" in err
    assert not (tmp_path / "compare.png").exists()


@pytest.mark.parametrize("uri, message", [
    ("sqlite:///{tmp}/absent.db", "does not exist: no run was tracked there"),
    ("http://127.0.0.1:9", "MLflow tracking server http://127.0.0.1:9 is unreachable"),
])
def test_compare_without_a_store_is_one_line(monkeypatch, capsys, tmp_path, uri, message):
    from lit_ppo.cli.compare import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["compare"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "absent.db").exists()  # reading never creates a store


@pytest.mark.parametrize("args, message", [
    (["seed=range(1"], "override 'seed=range(1' does not parse"),
    (["seed=0,,1"], "override 'seed=0,,1' does not parse"),
    (["seed=interval(0,1)"], "a grid sweeps a,b / range(...) / choice(...) / glob(...), not interval sweep"),
    (["algo=grpo,nope"], "[2/2] algo=nope: algo=nope is invalid: must be one of"),
    (["algo=grpo,rloo", "logger=none"], "[1/2] algo=grpo: the logger tracks no MLflow run"),
    (["algo=grpo,rloo", "logger=csv"], "[1/2] algo=grpo: the logger tracks no MLflow run"),
    (["seed=0,1", "--bogus", "x"], "unrecognized arguments: --bogus x"),
    (["seed=0,1", "--experiment"], "argument --experiment: expected one argument"),
    ([], "nothing to sweep"),
])
def test_sweep_bad_grid_fails_before_anything_runs(monkeypatch, capsys, tmp_path, args, message):
    import lit_ppo.cli.sweep as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "run_fit", lambda *a: pytest.fail("a fit started"))
    assert sweep.main(["sweep", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not list(tmp_path.iterdir())


def test_sweep_runs_the_grid_in_order(monkeypatch, capsys, tmp_path):
    """Every combination of a 2 x 2 grid, in BasicSweeper's order (the last key varies fastest), each fit
    given its values and the fixed overrides, all into the one experiment."""
    import lit_ppo.cli.sweep as sweep

    started = []

    def fit(overrides: list[str], env: dict, signals) -> tuple[int, None, None]:
        started.append((overrides, env["MLFLOW_EXPERIMENT_NAME"]))
        return 0, None, None

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "run_fit", fit)
    assert sweep.main(["sweep", "algo=grpo,rloo", "seed=0,1", "trainer.max_steps=2", "--experiment", "grid"]) == 0
    assert started == [([f"algo={algo}", f"seed={seed}", "trainer.max_steps=2"], "grid")
                       for algo in ("grpo", "rloo") for seed in ("0", "1")]
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert progress == ["[1/4] fit algo=grpo seed=0", "[2/4] fit algo=grpo seed=1", "[3/4] fit algo=rloo seed=0",
                        "[4/4] fit algo=rloo seed=1"]


def test_sweep_runs_the_rest_after_a_failure_and_exits_1_naming_it(monkeypatch, capsys, tmp_path):
    import lit_ppo.cli.sweep as sweep

    started = []

    def fit(overrides: list[str], env: dict, signals) -> tuple[int, None, None]:
        started.append(overrides)
        assert env["MLFLOW_EXPERIMENT_NAME"] == "failing"
        return (1 if "algo=rloo" in overrides else 0), None, None

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "run_fit", fit)
    assert sweep.main(["sweep", "algo=rloo,grpo", "trainer.max_steps=2", "--experiment", "failing"]) == 1
    assert started == [["algo=rloo", "trainer.max_steps=2"], ["algo=grpo", "trainer.max_steps=2"]]
    assert capsys.readouterr().err.splitlines()[-1] == "error: 1 of 2 fits failed: [1/2] algo=rloo (exit 1)"


def test_sweep_starts_no_fit_after_a_stop_signal(monkeypatch, capsys, tmp_path):
    import os

    import lit_ppo.cli.sweep as sweep

    started = []

    def fit(overrides: list[str], env: dict, signals) -> tuple[int, None, None]:
        started.append(overrides)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by the sweep: recorded, forwarded to the running fit
        return 128 + signal.SIGTERM, None, None

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep, "run_fit", fit)
    before = signal.getsignal(signal.SIGTERM)
    assert sweep.main(["sweep", "seed=0,1,2"]) == 128 + signal.SIGTERM
    assert started == [["seed=0"]]
    assert "sweep stopped by SIGTERM after 1 of 3 fits" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the sweep's handler is gone

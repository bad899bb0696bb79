"""Every run has its own directory and MLflow run: concurrent first starts on one fresh sqlite store,
runs without tracking, a replayed config tagged with the code that runs, tracking settings left to the
environment by a printed config, and an unreachable tracking server that fails at once."""

from __future__ import annotations

import multiprocessing
import re
import socket
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lit_ppo.launch.compose import compose
from lit_ppo.run.continued import continued_run
from lit_ppo.run.mlflow_store import prepare_store
from lit_ppo.run.run_dir import create_run_dir, run_name
from lit_ppo.training.record import RECORD_KEY, RUN_KEY
from tests.integration.conftest import REPO, run_cli

# One RL iteration of the tiny model on the smallest batch: the cost is start-up, not training.
TINY = ["trainer.max_steps=1", "data.batch_size=2", "gconfig.n_samples=2", "trainer.enable_progress_bar=false",
        "eval.max_problems=4"]
NAME = re.compile(r"grpo-arithmetic-tiny-\d{8}-\d{6}(-\d+)?")


@pytest.fixture(autouse=True)
def no_tracking_environment(monkeypatch):
    """The runs below see only the tracking settings each test gives them."""
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "LIT_PPO_RUN_DIR"):
        monkeypatch.delenv(key, raising=False)


def at_once(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def printed(result: subprocess.CompletedProcess, label: str) -> list[str]:
    """The values of the ``<label>: <value>`` lines a run printed."""
    return [line.split(": ", 1)[1] for line in (result.stdout + result.stderr).splitlines()
            if line.startswith(f"{label}: ")]


def mlflow_runs(db: Path) -> dict[str, dict]:
    """run id -> name, experiment, tags and params, read from the sqlite store itself."""
    with sqlite3.connect(db) as con:
        runs = {run_id: {"name": name, "experiment": experiment, "tags": {}, "params": {}}
                for run_id, name, experiment in
                con.execute("SELECT r.run_uuid, r.name, e.name FROM runs r JOIN experiments e "
                            "ON r.experiment_id = e.experiment_id")}
        for run_id, key, value in con.execute("SELECT run_uuid, key, value FROM tags"):
            runs[run_id]["tags"][key] = value
        for run_id, key, value in con.execute("SELECT run_uuid, key, value FROM params"):
            runs[run_id]["params"][key] = value
    return runs


def head_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO,
                          check=True).stdout.strip()


def assert_own_directory(cwd: Path, result: subprocess.CompletedProcess, experiment: str) -> Path:
    assert result.returncode == 0, result.stderr[-3000:]
    (shown,) = printed(result, "run directory")
    path = cwd / shown
    assert path.parent == cwd / "runs" / experiment and NAME.fullmatch(path.name), shown
    assert (path / "config.yaml").is_file() and (path / "checkpoints" / "last.ckpt").is_file()
    return path


@pytest.mark.slow
def test_two_first_runs_at_once_on_a_fresh_sqlite_store(tmp_path):
    """Both succeed (MLflow's schema migrations would race), each in its own directory and MLflow run
    named alike; the one replaying a config file that holds an old git_sha is tagged with the code
    that runs."""
    config = compose(TINY)  # what --print_config prints, as LightningCLI's tree
    config["trainer"]["logger"]["init_args"]["tags"]["git_sha"] = "0000000"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    results = at_once(lambda: run_cli(["fit", *TINY], tmp_path),
                      lambda: run_cli(["fit", "--config", "run.yaml"], tmp_path))
    dirs = [assert_own_directory(tmp_path, r, "lit_ppo") for r in results]
    assert dirs[0] != dirs[1]
    assert sorted(p.name for p in (tmp_path / "runs" / "lit_ppo").iterdir()) == sorted(p.name for p in dirs)
    assert all("algo: grpo" in (p / "config.yaml").read_text() for p in dirs)

    runs = mlflow_runs(tmp_path / "mlflow.db")
    ids = [printed(r, "mlflow run id")[0].split()[0] for r in results]
    assert sorted(ids) == sorted(runs) and ids[0] != ids[1]
    assert all(" (sqlite:///mlflow.db, experiment lit_ppo)" in printed(r, "mlflow run id")[0] for r in results)
    for run_id, path in zip(ids, dirs):
        run = runs[run_id]
        assert run["name"] == path.name and run["experiment"] == "lit_ppo"
        assert run["tags"]["git_sha"] == head_sha() and run["tags"]["algo"] == "grpo"
        assert Path(run["tags"]["run_dir"]) == path.resolve()
        # Every config field is a param, under the name the user types: runs compare field by field.
        params = run["params"]
        assert params["algo"] == "grpo" and params["actor.eps_clip"] == "0.2" and params["gconfig.n_samples"] == "2"
        assert params["actor.reward_norm.mean_level"] == "group" and params["model.source"] == "tiny"
        assert params["data.batch_size"] == "2" and params["trainer.max_steps"] == "1" and params["seed"] == "0"
        assert len(params) > 80, sorted(params)


@pytest.mark.slow
def test_runs_without_tracking_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "no_tracking")
    results = at_once(*[lambda: run_cli(["fit", "logger=none", *TINY], tmp_path)] * 2)
    dirs = [assert_own_directory(tmp_path, r, "no_tracking") for r in results]
    assert dirs[0] != dirs[1]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["no_tracking"]  # nothing shared at the top
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert all(not printed(r, "mlflow run id") for r in results)


@pytest.mark.slow
def test_printed_config_leaves_tracking_to_the_environment(tmp_path, monkeypatch, capsys):
    from lit_ppo.__main__ import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    monkeypatch.chdir(tmp_path)  # in this process: printing reads the environment, it starts no run
    with pytest.raises(SystemExit) as exit_info:  # --print_config exits after printing
        main(["fit", "--print_config"])
    stdout, stderr = capsys.readouterr()
    assert exit_info.value.code in (0, None), stderr[-3000:]
    logger = yaml.safe_load(stdout)["trainer"]["logger"]["init_args"]
    assert logger["tracking_uri"] is None and logger["experiment_name"] is None
    assert "127.0.0.1" not in stdout and "from_env" not in stdout
    assert "git_sha" not in logger["tags"]  # the running code's sha is not the printing code's
    assert not (tmp_path / "runs").exists()  # printing is not a run
    # What the user sets is kept (the Hydra tree is what gets printed).
    chosen = compose(["logger.init_args.tracking_uri=sqlite:///mine.db", "logger.init_args.experiment_name=mine"])
    init_args = chosen["trainer"]["logger"]["init_args"]
    assert (init_args["tracking_uri"], init_args["experiment_name"]) == ("sqlite:///mine.db", "mine")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_unreachable_tracking_server_fails_at_once_with_one_line(tmp_path):
    uri = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    result = run_cli(["fit", *TINY], tmp_path, timeout=60, env={"MLFLOW_TRACKING_URI": uri})
    assert time.monotonic() - start < 60  # MLflow's own client retries for minutes; import alone takes ~7 s
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: MLflow tracking server {uri} is unreachable (MLFLOW_TRACKING_URI): "
                      "[Errno 111] Connection refused"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # it failed before the run began


def _create(root: str, barrier, queue) -> None:
    barrier.wait()
    queue.put(str(create_run_dir(root, "lit_ppo", "grpo-arithmetic-tiny-20261201-101500")))


def test_run_directories_are_exclusive_across_processes(tmp_path):
    """Runs that start in the same second in one place get one directory each."""
    context = multiprocessing.get_context("fork")
    n = 8
    barrier, queue = context.Barrier(n), context.Queue()
    workers = [context.Process(target=_create, args=(str(tmp_path), barrier, queue)) for _ in range(n)]
    for w in workers:
        w.start()
    made = sorted(queue.get(timeout=30) for _ in workers)
    for w in workers:
        w.join(timeout=30)
    base = tmp_path / "lit_ppo" / "grpo-arithmetic-tiny-20261201-101500"
    assert made == sorted([str(base)] + [f"{base}-{k}" for k in range(2, n + 1)])


def test_run_name_is_what_ran_and_when():
    when = time.mktime((2026, 12, 1, 10, 15, 0, 0, 0, -1))
    assert run_name("grpo-arithmetic-tiny", when) == "grpo-arithmetic-tiny-20261201-101500"
    assert run_name("my run/1", when) == "my_run_1-20261201-101500"


def _prepare(uri: str, barrier, queue) -> None:
    barrier.wait()
    try:
        prepare_store(uri, "test", "lit_ppo")
        queue.put("ok")
    except Exception as e:  # the parent reports it
        queue.put(f"{type(e).__name__}: {e}")


@pytest.mark.slow
def test_store_creation_is_serialised(tmp_path):
    """Two processes opening one fresh sqlite store at the same instant both find it ready."""
    import mlflow  # noqa: F401  (imported once here, not in each forked process)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_prepare, args=(uri, barrier, queue)) for _ in range(2)]
    for w in workers:
        w.start()
    outcomes = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    assert outcomes == ["ok", "ok"]
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("SELECT count(*) FROM experiments WHERE name = 'lit_ppo'").fetchone() == (1,)


def resumed_config(tmp_path: Path, run: dict, uri: str) -> SimpleNamespace:
    """A parsed ``fit`` config resuming from a checkpoint that records ``run``, tracked in ``uri``."""
    import torch

    # In the run's checkpoints/ where the run directory is there (a checkpoint outside it branches).
    inside = Path(run["dir"]) / "checkpoints" if Path(run.get("dir") or tmp_path / "none").is_dir() else tmp_path
    inside.mkdir(exist_ok=True)
    ckpt = inside / "last.ckpt"
    torch.save({RECORD_KEY: {"algo": "grpo", RUN_KEY: run}}, ckpt)
    logger = {"class_path": "lit_ppo.run.loggers.MLflowRunLogger",
              "init_args": {"tracking_uri": uri, "experiment_name": "lit_ppo", "run_id": None}}
    return SimpleNamespace(ckpt_path=str(ckpt), trainer=SimpleNamespace(logger=logger))


def test_a_resume_continues_the_recorded_run_only_where_it_still_is(tmp_path, capsys):
    """The recorded MLflow run becomes the logger's run; a deleted run, a run of another experiment, a
    run directory that is gone or a checkpoint that records none starts a new run, saying why."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(uri, "test", "lit_ppo")
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.get_experiment_by_name("lit_ppo").experiment_id).info.run_id
    run_dir = tmp_path / "runs" / "lit_ppo" / "grpo-arithmetic-tiny-20261201-101500"
    run_dir.mkdir(parents=True)
    recorded = {"dir": str(run_dir), "mlflow_run_id": run_id, "mlflow_tracking_uri": uri}
    capsys.readouterr()  # MLflow's notes on creating the store

    config = resumed_config(tmp_path, recorded, uri)
    assert continued_run(config) == run_dir and config.trainer.logger["init_args"]["run_id"] == run_id
    assert capsys.readouterr().err == ""

    ckpt = tmp_path / "last.ckpt"
    gone = resumed_config(tmp_path, {**recorded, "dir": str(tmp_path / "gone")}, uri)
    assert continued_run(gone) is None and gone.trainer.logger["init_args"]["run_id"] is None
    assert capsys.readouterr().err == (f"note: --ckpt_path {ckpt}: its run directory {tmp_path / 'gone'} is gone: "
                                       "starting a new run\n")
    assert continued_run(resumed_config(tmp_path, {}, uri)) is None
    assert capsys.readouterr().err == f"note: --ckpt_path {ckpt}: it records no run directory: starting a new run\n"

    ckpt = run_dir / "checkpoints" / "last.ckpt"
    other = client.create_experiment("other")
    elsewhere = client.create_run(other).info.run_id
    assert continued_run(resumed_config(tmp_path, {**recorded, "mlflow_run_id": elsewhere}, uri)) is None
    assert capsys.readouterr().err == (f"note: --ckpt_path {ckpt}: its MLflow run {elsewhere} is in experiment "
                                       "other, not lit_ppo: starting a new run\n")
    client.delete_run(run_id)
    assert continued_run(resumed_config(tmp_path, recorded, uri)) is None
    assert capsys.readouterr().err == (f"note: --ckpt_path {ckpt}: its MLflow run {run_id} (of {uri}) is not in "
                                       f"{uri}: starting a new run\n")

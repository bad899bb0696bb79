"""Paths as users give them: ``~`` in data paths, tracking URIs and ``compare --output``; compare's runs by
name; and the places that stop a run in one line: a named pipe as data, a file where the runs root should
be, a read-only model cache, a read-only figure directory, a user's ``mlflow.py`` in the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_ppo.__main__ import main
from tests.faults.filesystems import read_only_directory

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home directory of its own, and a working directory apart from it."""
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "home"


def one_line(capsys, code: int, expected_code: int = 2) -> str:
    err = capsys.readouterr().err.strip()
    assert code == expected_code and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_data_path_under_home_is_read_and_recorded_by_its_content(home):
    from lit_ppo.tasks.dataset import DatasetTask, data_digest, read_rows
    from lit_ppo.training.record import task_identity

    (home / "train.jsonl").write_text("".join(f'{{"prompt": "{r["prompt"]}", "answer": "{r["answer"]}"}}\n'
                                              for r in ROWS))
    assert read_rows("~/train.jsonl", "train_path") == ROWS
    task = DatasetTask(train_path="~/train.jsonl", test_fraction=0.5, reward_fns=["exact_match"])
    assert task_identity(task)["task.train_path.sha256"] == data_digest(home / "train.jsonl")


def test_a_tracking_uri_under_home_is_a_database_there(home):
    from lit_ppo.run.mlflow_store import prepare_store, resolve_tracking_uri

    uri = resolve_tracking_uri("sqlite:///~/tracking.db")
    assert uri == f"sqlite:///{home}/tracking.db"
    prepare_store(uri, "logger.init_args.tracking_uri", "homed")
    assert (home / "tracking.db").is_file() and not (Path.cwd() / "~").exists()


@pytest.fixture
def store(home, monkeypatch):
    """A sqlite store in the working directory with three runs that logged the reward: two named ``twin``."""
    import mlflow

    uri = f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("paths")
    runs = {}
    for name in ("alone", "twin", "twin"):
        run = client.create_run(experiment, run_name=name)
        for step in (1, 2):
            client.log_metric(run.info.run_id, "rollout/reward_mean", 0.1 * step, step=step)
        client.set_terminated(run.info.run_id)
        runs.setdefault(name, []).append(run.info.run_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return runs


def test_compare_takes_run_names_and_a_figure_under_home(store, home, capsys):
    capsys.readouterr()
    assert main(["compare", "--runs", "alone", "--output", "~/figure.png"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[:2] == ["alone", store["alone"][0][:8]]
    assert (home / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = one_line(capsys, main(["compare", "--runs", "twin"]))
    ids = ", ".join(sorted(run_id[:8] for run_id in store["twin"]))
    assert err == f"error: --runs twin: 2 runs have that name (ids {ids}): give the id of one"


def test_compare_into_a_read_only_directory_is_one_line(store, tmp_path, capsys):
    with read_only_directory(tmp_path / "ro") as ro:
        capsys.readouterr()
        err = one_line(capsys, main(["compare", "--output", str(ro / "figure.png")]))
        reason = os.strerror(30 if os.geteuid() == 0 else 13)  # EROFS for root (a read-only mount), else EACCES
        assert err == f"error: --output {ro / 'figure.png'}: cannot be written, {ro} is not writable ({reason})"
        assert list(ro.iterdir()) == []


def test_a_file_where_the_runs_root_goes_is_one_line(home, capsys, no_model_loading):
    (Path.cwd() / "runs").write_text("notes")
    err = one_line(capsys, main(["fit", "logger=none"]))
    assert err == (f"error: trainer.default_root_dir={Path.cwd() / 'runs'}: run directories cannot be made there, "
                   f"{Path.cwd() / 'runs'} is a file, not a directory: move it, or give another "
                   f"trainer.default_root_dir")
    assert (Path.cwd() / "runs").read_text() == "notes"


def test_a_read_only_model_cache_is_one_line_naming_the_variable(home, tmp_path, capsys, monkeypatch):
    with read_only_directory(tmp_path / "ro") as ro:
        monkeypatch.setenv("LIT_PPO_CACHE", str(ro / "cache"))
        capsys.readouterr()
        code = main(["fit", "logger=none", "trainer.max_steps=1"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and "Traceback" not in "\n".join(lines)
        assert lines[-1].startswith(f"error: LIT_PPO_CACHE={ro / 'cache'}: cannot hold the model entry tiny-")
        assert lines[-1].endswith(f"that this run builds ({os.strerror(30 if os.geteuid() == 0 else 13)}): "
                                  f"give a writable directory"), lines


def test_a_named_pipe_as_data_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "train.jsonl")
    result = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", "data=dataset",
                             "data.task_kwargs.train_path=train.jsonl", "logger=none"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.task_kwargs.train_path='train.jsonl': is a named pipe (FIFO), not a regular file or a "
        "directory: give a file it can read whole")


def test_a_users_mlflow_py_is_named_in_one_line(tmp_path):
    (tmp_path / "mlflow.py").write_text("token = 'mine'\n")
    for command in (["compare"], ["fit", "trainer.max_steps=1"]):
        result = subprocess.run([sys.executable, "-m", "lit_ppo", *command], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120, env={**os.environ, "LIT_PPO_CACHE": str(tmp_path / "cache")})
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: {tmp_path / 'mlflow.py'} hides the mlflow package that tracks runs (Python imports the file "
            f"instead): rename that file"), command
    assert not (tmp_path / "runs").exists()

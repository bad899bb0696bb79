"""Shared helpers: run the real CLI in a subprocess on the tiny model, small batches, no tracking."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..conftest import USER_OMP_NUM_THREADS

REPO = Path(__file__).resolve().parents[2]
# Small enough for seconds per iteration on 2 cores, large enough to exercise groups and minibatches.
FAST = ["logger=none", "trainer.max_steps=2", "data.batch_size=4", "gconfig.n_samples=4", "eval.max_problems=4"]


def run_cli(args: list[str], cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m lit_ppo <args>`` in ``cwd``; ``env``: variables set on top of this process's (None: unset)."""
    full_env = {**os.environ, "LIT_PPO_CACHE": str(cwd / "cache"), **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    return subprocess.run([sys.executable, "-m", "lit_ppo", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 400) -> None:
    """Wait until the file ``path`` (a job's log) contains ``text``; fail if ``proc`` ends first or
    ``timeout`` seconds pass (then ``proc`` is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {text!r}: {path.read_text()[-3000:] if path.exists() else ''}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {text!r} within {timeout} s: {path.read_text()[-3000:] if path.exists() else ''}")


def sigkill(child: subprocess.Popen) -> None:
    """SIGKILL ``child`` and check that it died of it."""
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL


def reap(child: subprocess.Popen) -> None:
    """End ``child`` if it still runs (a test that failed before it could stop it) and wait for it."""
    if child.poll() is None:
        child.kill()
        child.wait()


def run_dir(cwd: Path) -> Path:
    """The directory of the one run made in ``cwd``: runs/<experiment>/<run name>/."""
    (config,) = (cwd / "runs").glob("*/*/config.yaml")
    return config.parent


@pytest.fixture
def cli(tmp_path):
    def call(*args: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli(list(args), tmp_path, timeout, env)

    call.cwd = tmp_path
    return call


def run_here(args: list[str], cwd: Path, monkeypatch, capfd, env: dict | None = None) -> subprocess.CompletedProcess:
    """``run_cli``'s command through the same entry point in this process (``python -m lit_ppo`` is
    ``lit_ppo.__main__.main``), in ``cwd`` with its cache and ``env`` on top of this process's (``monkeypatch``
    puts them back): a CompletedProcess like ``run_cli``'s, without the seconds of a new interpreter's imports."""
    from lit_ppo.__main__ import main

    monkeypatch.chdir(cwd)
    for key, value in {"LIT_PPO_CACHE": str(cwd / "cache"), **(env or {})}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    for key in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # an earlier seed_everything's, not this run's
        monkeypatch.delenv(key, raising=False)
    # A dependency's log handler holds the stderr of when it was made (lightning's, made at its import, writes
    # "`Trainer.fit` stopped: ..." there): in a new process that is the process's stderr, here an earlier
    # test's capture. For the call, they write to this test's stderr.
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = [h for logger in loggers for h in getattr(logger, "handlers", ())
                if type(h) is logging.StreamHandler and h.stream is not sys.stdout]
    capfd.readouterr()
    streams = [h.stream for h in handlers]
    for handler in handlers:
        handler.stream = sys.stderr  # not setStream, which flushes the old one (maybe closed)
    environ = dict(os.environ)  # what the run sets for its own ranks (its run directory) ends with it
    try:
        code = main(list(args))
    except SystemExit as e:  # --print_config and --help exit after printing
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for handler, stream in zip(handlers, streams):
            handler.stream = stream
        os.environ.clear()
        os.environ.update(environ)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([sys.executable, "-m", "lit_ppo", *args], code, out, err)


@pytest.fixture
def cli_here(cli, capfd, monkeypatch):
    """``cli``'s command in this process (``run_here``), in the same working directory and cache. For tests
    where one representative of the kind runs in a real subprocess (exit code, stderr as a user sees them,
    dependency noise)."""
    def call(*args: str) -> subprocess.CompletedProcess:
        return run_here(list(args), cli.cwd, monkeypatch, capfd)

    call.cwd = cli.cwd
    return call


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """The README's demo, ``python -m lit_ppo fit algo=grpo`` (100 iterations of the default task),
    tracked in a sqlite MLflow store: the one trained tiny run that tests read instead of training
    their own, on the caller's torch threads as a user's run (its metrics are recorded per thread count).
    Attributes: cwd, dir (the run directory), env (its environment over this process's), stdout, stderr."""
    cwd = tmp_path_factory.mktemp("demo")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", "OMP_NUM_THREADS": USER_OMP_NUM_THREADS}
    result = run_cli(["fit", "algo=grpo"], cwd, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return SimpleNamespace(cwd=cwd, dir=run_dir(cwd), env=env, stdout=result.stdout, stderr=result.stderr)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    """A tiny model of another seed, with the tiny policy's tokenizer, saved as a directory: a teacher for
    algo=opd (model.teacher)."""
    from lit_ppo.models import TinyModelConfig, build_tiny

    path = tmp_path_factory.mktemp("teacher")
    model, tokenizer = build_tiny(TinyModelConfig(seed=1), path / "cache")
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "model")
    return str(path / "model")


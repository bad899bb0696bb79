"""``lit_ppo.cli.reporting``: every way a job's command ends is one line and an exit code, the same for fit,
validate, test and sft."""

from __future__ import annotations

import signal

import pytest

from lit_ppo.cli.reporting import reported
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.run import RunFailed
from lit_ppo.run.processes import RUN_DIR_ENV
from lit_ppo.utils.stop_requests import Stopped


def raising(error: BaseException):
    def command() -> int:
        raise error
    return command


@pytest.mark.parametrize("subcommand, error, code, line", [
    ("sft", ConfigError("sft.epochs=0 is invalid"), 2, "error: sft.epochs=0 is invalid"),
    ("sft", RunFailed("tracking store failed"), 1, "error: tracking store failed"),
    ("fit", Stopped(signal.SIGTERM), 143, "error: stopped by SIGTERM before the first iteration: nothing was trained"),
    ("validate", Stopped(signal.SIGINT), 130, "error: stopped by SIGINT during validate: no scores"),
])
def test_each_outcome_is_one_line_and_its_exit_code(capsys, monkeypatch, tmp_path, subcommand, error, code, line):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    assert reported(subcommand, raising(error)) == code
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not (tmp_path / "error.log").exists()  # nothing but the line belongs to these


def test_a_failure_keeps_its_traceback_in_the_run_directory(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    assert reported("sft", raising(RunStopped("reward_fn called sys.exit()"))) == 1
    log = tmp_path / "error.log"
    assert capsys.readouterr().err.strip() == f"error: reward_fn called sys.exit() (traceback in {log})"
    assert reported("sft", raising(OSError("disk full"))) == 1
    assert capsys.readouterr().err.strip() == f"error: OSError: disk full (traceback in {log})"
    assert "OSError: disk full" in log.read_text()

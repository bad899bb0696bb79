"""Settings that only fail when the run starts are refused before any model loads, in one line, exit
code 2: a seed numpy cannot take, a run name too long for its run directory, a tracking URI whose
database driver is missing or whose database lives in memory; and a Slurm job's log paths are quoted, so
a run directory with spaces works."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from lit_ppo.__main__ import main
from lit_ppo.launch.check import check_config
from lit_ppo.launch.compose import compose
from lit_ppo.run.run_dir import new_run_dir
from tests.integration.conftest import run_cli

pytestmark = pytest.mark.usefixtures("no_model_loading")


def error_of(capsys, *args: str) -> str:
    """The one line ``fit *args`` prints, asserting exit code 2 and no traceback."""
    code = main(["fit", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("args,expected", [
    (["seed=4294967296"], "seed=4294967296 is invalid: must be an integer in [0, 4294967295]"),
    (["seed=-1"], "seed=-1 is invalid: must be an integer in [0, 4294967295]"),
    (["seed_everything=-1"], "seed=-1 is invalid: must be an integer in [0, 4294967295]"),
    (["data.seed=4294967296"], "data.seed=4294967296 is invalid: must be an integer in [0, 4294967295]"),
])
def test_seeds_outside_numpys_range_are_refused(capsys, args, expected):
    assert error_of(capsys, "logger=none", *args) == f"error: {expected}"


def test_the_largest_seed_is_accepted():
    check_config(compose(["logger=none", "seed=4294967295"]))


def test_a_run_name_too_long_for_its_directory_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert error_of(capsys, f"logger.init_args.run_name={'r' * 237}") == (
        "error: logger.init_args.run_name=rrrrrrrrrrrrrrrrrrrrrrrr... is invalid: must be at most 236 characters (it "
        "has 237): the run directory, <run name>-YYYYmmdd-HHMMSS, is one file name of at most 255 bytes")
    assert not (tmp_path / "runs").exists()


def test_the_longest_run_name_makes_its_directories(tmp_path):
    """236 characters: the run directory and its collision's ``-99`` fit this filesystem's file names."""
    tree = compose([f"logger.init_args.run_name={'r' * 236}", f"trainer.default_root_dir={tmp_path}"])
    check_config(tree)
    first = new_run_dir(tree)
    assert first.parent == tmp_path / "lit_ppo" and len(first.name) == 236 + len("-YYYYmmdd-HHMMSS")
    (first.parent / (first.name + "-99")).mkdir()


@pytest.mark.slow
def test_a_missing_database_driver_is_one_line_in_a_real_process(tmp_path):
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed")
    result = run_cli(["fit", "logger=mlflow", "trainer.max_steps=1"], tmp_path,
                     env={"MLFLOW_TRACKING_URI": "postgresql+psycopg2://u:secret@localhost/db"})
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: MLFLOW_TRACKING_URI=postgresql+psycopg2://u:***@localhost/db needs the database driver psycopg2, "
        "which is not installed: pip install psycopg2-binary")
    assert "Traceback" not in result.stderr and not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("uri,module,package", [
    ("mysql://u:p@db.example/runs", "MySQLdb", "mysqlclient"),
    ("mysql+pymysql://db.example/runs", "pymysql", "PyMySQL"),
    ("mssql+pyodbc://u:p@db.example/runs", "pyodbc", "pyodbc"),
])
def test_missing_database_drivers_name_the_package(capsys, tmp_path, monkeypatch, uri, module, package):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    shown = uri.replace("u:p@", "u:***@")
    assert error_of(capsys, "trainer.max_steps=1") == (
        f"error: MLFLOW_TRACKING_URI={shown} needs the database driver {module}, which is not installed: "
        f"pip install {package}")


def test_the_default_postgresql_driver_and_a_configured_uri(capsys, tmp_path, monkeypatch):
    """postgresql:// takes SQLAlchemy's default driver; logger.init_args.tracking_uri is named as the source."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    line = error_of(capsys, "trainer.max_steps=1", "logger.init_args.tracking_uri=postgresql://u:p@localhost/db")
    found = re.fullmatch(r"error: logger\.init_args\.tracking_uri=postgresql://u:\*\*\*@localhost/db needs the "
                         r"database driver (\w+), which is not installed: pip install (\S+)", line)
    assert found and importlib.util.find_spec(found.group(1)) is None, line


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_tracking_store_is_refused(capsys, tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert error_of(capsys, "trainer.max_steps=1") == (
        f"error: MLFLOW_TRACKING_URI={uri} is invalid: an in-memory database is gone when the process ends, and the "
        f"run's tracking with it: give a database file, e.g. sqlite:///path.db")
    assert not (tmp_path / "runs").exists()


def test_slurm_log_paths_with_spaces_are_quoted(tmp_path, monkeypatch, capsys):
    import lit_ppo.launch.lightning_cli as lightning_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lightning_cli, "LitPPOCLI", None)  # nothing is instantiated
    root = tmp_path / "my runs" / "50%"
    assert main(["fit", "logger=none", f"trainer.default_root_dir='{root}'", "scheduler=slurm",
                 "scheduler.dry_run=true"]) == 0
    out, err = capsys.readouterr()
    run_dir = Path(re.search(r"batch script: (.+)/slurm/job\.sbatch$", err, re.M).group(1))
    assert run_dir.parent == root / "lit_ppo"
    logs = f"{tmp_path}/my runs/50%%/lit_ppo/{run_dir.name}/slurm"  # %% is sbatch's literal %
    sbatch = [line for line in out.splitlines() if line.startswith("#SBATCH --output") or
              line.startswith("#SBATCH --error")]
    assert sbatch == [f'#SBATCH --output="{logs}/%j.out"', f'#SBATCH --error="{logs}/%j.err"']
    assert f"export LIT_PPO_JOB_RUN_DIR='{run_dir}'\n" in out

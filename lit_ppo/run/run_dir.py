"""What a run directory is and which one a run gets.

Every ``fit`` gets ``<trainer.default_root_dir>/<experiment>/<run name>/``, e.g.
``runs/lit_ppo/grpo-arithmetic-tiny-20261201-101500/``, holding its ``config.yaml`` and
``checkpoints/`` with or without MLflow; the MLflow run has the same name. The directory is created
with an exclusive ``mkdir`` (``-2``, ``-3``, ... on a collision), so concurrent runs never share one.
Rank 0 chooses it before Lightning starts the other ranks, which inherit it through
``LIT_PPO_RUN_DIR`` (``lit_ppo.run.processes``); ranks started by an external launcher receive it by
broadcast at setup. A Slurm job's directory is chosen when it is submitted (``LIT_PPO_JOB_RUN_DIR``,
lit_ppo.schedulers.slurm) and taken by that job only (``job_run_dir``). ``--ckpt_path last`` is resolved
here (``last_checkpoint``).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from lit_ppo.errors import ConfigError
from lit_ppo.run.lock import LOCK_NAME
from lit_ppo.run.mlflow_store import resolve_experiment
from lit_ppo.utils.config_values import config_value
from lit_ppo.utils.imports import is_object_reference

JOB_RUN_DIR_ENV = "LIT_PPO_JOB_RUN_DIR"
"""A batch job's run directory, fixed when the job was submitted (lit_ppo.schedulers.slurm): rank 0 of
every start of that job takes it instead of creating one (``job_run_dir``)."""


def as_file_name(text: str) -> str:
    """``text`` as one file name: characters other than letters, digits, '_', '.', '-' become '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._") or "none"


def _name_part(text: str) -> str:
    """The telling part of a task or model setting: a local path's last part, a dotted name's last (of a
    Python object's reference too: ``python:__main__.Doubling`` is ``Doubling``)."""
    if is_object_reference(text):
        return as_file_name(text.split("#")[0].rsplit(".", 1)[-1])
    text = os.path.basename(str(text).rstrip("/"))
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*){2,}", text):  # package.module.Name (a file has one dot)
        text = text.rsplit(".", 1)[1]
    return as_file_name(text)


def run_name(description: str, when: float | None = None) -> str:
    """``<description>-<YYYYmmdd-HHMMSS>`` in local time."""
    return f"{as_file_name(description)}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}"


def create_run_dir(root: str | Path, experiment: str, name: str) -> Path:
    """``root/experiment/name``, created by this call and no other: the first of ``name``, ``name-2``,
    ``name-3``, ... that does not exist yet (``mkdir`` either creates a directory or fails, atomically,
    so runs that start in the same second in one place never share a directory)."""
    parent = Path(root) / as_file_name(experiment)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocking = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
        reason = f"{blocking} is a file, not a directory" if blocking else f"{parent}: {e.strerror or e}"
        raise ConfigError(f"trainer.default_root_dir={root}: run directories cannot be made there, {reason}: move it, "
                          f"or give another trainer.default_root_dir") from None
    for n in itertools.count(1):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def what_ran(config: Any) -> dict[str, str]:
    """algo, task and model of the parsed ``fit`` config, task and model shortened as in run names."""
    model, data = config_value(config, "model"), config_value(config, "data")
    weights = config_value(config_value(model, "model"), "source") or "tiny"
    return {"algo": str(config_value(model, "algo")), "task": _name_part(config_value(data, "task")),
            "model": _name_part(weights)}


def _run_place(config: Any) -> tuple[Path, str, str]:
    """(root, experiment, description) of the runs of the parsed (or composed) ``fit`` config: their
    directories are ``<root>/<experiment>/<description>-<start time>``; the experiment and description are
    the first MLflow logger's experiment and run name, else ``<algo>-<task>-<model>``."""
    from lit_ppo.run.loggers import mlflow_settings, tracking_setting  # Lightning: run names are checked without

    loggers = mlflow_settings(config)
    experiment = tracking_setting(*loggers[0])[2] if loggers else resolve_experiment(None)
    prefixes = [init_args.get("run_name") for _, init_args in loggers if init_args.get("run_name")]
    description = prefixes[0] if prefixes else "-".join(_name_part(part) for part in what_ran(config).values())
    # Absolute, '~' expanded: checkpoints record where they are, and a resume (which may start elsewhere)
    # must find the same directory under the same name, or Lightning versions last.ckpt aside.
    root = Path(config_value(config_value(config, "trainer"), "default_root_dir") or "runs").expanduser().absolute()
    return root, experiment, description


def new_run_dir(config: Any) -> Path:
    """A new ``<trainer.default_root_dir>/<experiment>/<run name>`` for the parsed (or composed) ``fit``
    config (``_run_place``)."""
    root, experiment, description = _run_place(config)
    return create_run_dir(root, experiment, run_name(description))


def last_checkpoint(config: Any) -> Path:
    """What ``--ckpt_path last`` resumes: of the run directories named like the runs of the parsed (or
    composed) ``fit`` config, ``<root>/<experiment>/<description>-<start time>[-n]``, the one whose ``last.ckpt``
    was written last, its newest checkpoint (``newest_checkpoint``: ``last.ckpt``, or a periodic one that a kill
    left newer). ConfigError when none holds one."""
    root, experiment, description = _run_place(config)
    parent = root / as_file_name(experiment)
    named = re.compile(rf"{re.escape(as_file_name(description))}-\d{{8}}-\d{{6}}(-\d+)?")
    found = [d / "checkpoints" / "last.ckpt" for d in (parent.iterdir() if parent.is_dir() else ())
             if named.fullmatch(d.name)]
    found = [path for path in found if path.exists()]
    if not found:
        raise ConfigError(f"--ckpt_path last: no run directory {parent / as_file_name(description)}-<time> holds a "
                          f"checkpoints/last.ckpt: give the path of the checkpoint to resume")
    from lit_ppo.run.resume import newest_checkpoint  # torch: only a resume reads checkpoints

    return newest_checkpoint(max(found, key=lambda path: path.stat().st_mtime).parent)


JOB_MARKER = ".job"
"""File of a job's run directory naming the Slurm job (``SLURM_JOB_ID``, empty elsewhere) that took it."""
JOB_LOGS = "slurm"
"""Folder of a Slurm job's logs in its run directory (lit_ppo.schedulers.slurm), there before the job first starts."""
RAY_STORAGE = "ray"
"""Folder of Ray Train's storage in a Ray job's run directory (lit_ppo.schedulers.ray), there before its workers
start."""


def _scheduled_job_dir() -> Path | None:
    scheduled = os.environ.get(JOB_RUN_DIR_ENV)
    return Path(scheduled).expanduser().absolute() if scheduled else None


def _holds_run(path: Path) -> bool:
    """Whether ``path`` is a lit_ppo run's directory: a job took it, or a run locked it (every run does,
    first thing)."""
    return (path / JOB_MARKER).exists() or (path / LOCK_NAME).exists()


def check_job_run_dir() -> None:
    """ConfigError when ``LIT_PPO_JOB_RUN_DIR`` names what no run may be written into: a file, or a directory
    holding files but no run (the working directory, say), whose ``model/`` the export at the end of fit
    would replace. Called before anything is written, so that the refusal leaves everything as it was."""
    path = _scheduled_job_dir()
    if path is None or not path.exists() or _holds_run(path):
        return
    scheduled = os.environ[JOB_RUN_DIR_ENV]
    if not path.is_dir():
        raise ConfigError(f"{JOB_RUN_DIR_ENV}={scheduled} is a file, not a run directory: unset {JOB_RUN_DIR_ENV}, "
                          f"or name a new or empty directory")
    if any(entry.name not in (JOB_LOGS, RAY_STORAGE) for entry in path.iterdir()):
        raise ConfigError(f"{JOB_RUN_DIR_ENV}={scheduled} holds files but no lit_ppo run, and a job's run directory "
                          f"is new or empty (a scheduler makes it so): unset {JOB_RUN_DIR_ENV}, or name a new or "
                          f"empty directory")


def job_run_dir() -> Path | None:
    """The batch job's directory (``LIT_PPO_JOB_RUN_DIR``), where it is this process's: a new or empty one, or one
    holding only the job's logs (the job's first start, which marks it as the job's), or one that the same Slurm
    job took before (a requeued job). A value left in another shell names a directory holding another run: None,
    said in one line, so that a fresh fit never writes into that run. ConfigError for one that holds files but
    no run (``check_job_run_dir``)."""
    path = _scheduled_job_dir()
    if path is None:
        return None
    job = os.environ.get("SLURM_JOB_ID", "")
    marker = path / JOB_MARKER
    if job and marker.is_file() and marker.read_text().strip() == job:
        return path
    if not _holds_run(path):
        check_job_run_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
            marker.write_text(job)
        except OSError as e:
            raise ConfigError(f"{JOB_RUN_DIR_ENV}={os.environ[JOB_RUN_DIR_ENV]} cannot be made a run directory: "
                              f"{e.strerror or e}: name a directory this user can write") from None
        return path
    print(f"note: {JOB_RUN_DIR_ENV}={os.environ[JOB_RUN_DIR_ENV]} is not this process's job directory (it holds "
          f"another run): starting a new run", file=sys.stderr, flush=True)
    return None

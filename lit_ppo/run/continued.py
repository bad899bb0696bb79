"""Resuming continues the run the checkpoint records (``recorded_run``, stored in its ``lit_ppo`` record
by ``lit_ppo.run.tracked_run.run_reference``): the same directory, whose ``config.yaml`` stays the config
the run started with (the resuming config is saved beside it as ``config-resumed-<time>.yaml``), and the
same MLflow and W&B runs, RUNNING again, a setting the resume changed logged beside the run's params. A
checkpoint that branches from its run (older than the run's newest, or outside its directory) starts a new
run directory and MLflow run, and a run directory that is gone or an MLflow run not in the current store
a new run, each with one line on stderr saying why."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from lit_ppo.errors import TrackingError
from lit_ppo.run.resume import checkpoint_step, newest_checkpoint, recorded_run, saved_step
from lit_ppo.run.run_dir import new_run_dir
from lit_ppo.utils.config_values import config_mapping, config_value, set_config_value
from lit_ppo.utils.fs import shown_path
from lit_ppo.utils.text import first_line


def _missing_mlflow_run(uri: str | None, experiment: str, run_id: str, recorded_uri: str) -> str | None:
    """Why the MLflow run ``run_id`` (recorded in ``recorded_uri``) cannot be continued in ``uri``, or None."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise TrackingError(f"MLflow tracking store {client.tracking_uri} cannot be used: "
                                f"{first_line(e)}") from None
        run = None
    if run is None or run.info.lifecycle_stage == "deleted":
        return f"its MLflow run {run_id} (of {recorded_uri}) is not in {client.tracking_uri}"
    found = client.get_experiment(run.info.experiment_id).name
    if found != experiment:
        return f"its MLflow run {run_id} is in experiment {found}, not {experiment}"
    return None


def _branch(ckpt_path: str, run_dir: str) -> str | None:
    """Why resuming ``ckpt_path`` must not continue its run's directory ``run_dir`` (a run is never written
    over from an earlier point of it), or None: the checkpoint lies outside it (a copied run directory, a
    moved file), or the run has gone on past it (an older periodic checkpoint)."""
    checkpoint = Path(ckpt_path).resolve()
    step = checkpoint_step(checkpoint)
    where = f"--ckpt_path {ckpt_path} branches from iteration {step} of {shown_path(Path(run_dir))}"
    if not checkpoint.is_relative_to(Path(run_dir).resolve()):
        return f"{where} (it lies outside that directory)"
    newest = saved_step(newest_checkpoint(checkpoint.parent))
    return f"{where} (which has gone on to iteration {newest})" if newest > step else None


def continued_run(config: Any) -> Path | None:
    """On a resume, the checkpoint's run directory, its MLflow run set as the first MLflow logger's
    ``run_id``; a new run directory for a checkpoint that branches from its run (``_branch``); None (with a
    one-line note when a checkpoint was given) to start a new run."""
    from lit_ppo.run.loggers import WandbRunLogger, logger_specs, mlflow_loggers, tracking_setting  # Lightning's

    ckpt_path = config_value(config, "ckpt_path")
    record = recorded_run(ckpt_path)
    if record is None:
        return None
    run_dir, run_id = record.get("dir"), record.get("mlflow_run_id")
    loggers = mlflow_loggers(config.trainer.logger)[:1]
    missing = None
    if not run_dir:
        missing = "it records no run directory"
    elif not os.path.isdir(run_dir):
        missing = f"its run directory {run_dir} is gone"
    elif (branch := _branch(ckpt_path, run_dir)) is not None:
        path = new_run_dir(config)
        print(f"note: {branch}: new run directory {shown_path(path)}", file=sys.stderr, flush=True)
        return path
    elif loggers and run_id and not config_value(config_value(loggers[0][1], "init_args"), "run_id"):
        cls, spec = loggers[0]
        uri, _, experiment = tracking_setting(cls, config_mapping(config_value(spec, "init_args")))
        missing = _missing_mlflow_run(uri, experiment, run_id, record.get("mlflow_tracking_uri"))
        if missing is None:
            set_config_value(config_value(spec, "init_args"), "run_id", run_id)
    if missing is not None:
        print(f"note: --ckpt_path {ckpt_path}: {missing}: starting a new run", file=sys.stderr, flush=True)
        return None
    wandb_args = [config_value(spec, "init_args") for cls, spec in logger_specs(config.trainer.logger)
                  if issubclass(cls, WandbRunLogger)]
    if wandb_args and record.get("wandb_run_id") and not config_value(wandb_args[0], "run_id"):
        set_config_value(wandb_args[0], "run_id", record["wandb_run_id"])
    return Path(run_dir)


def forget_continued_runs(tree: dict) -> None:
    """Unset the ``run_id`` of every logger of LightningCLI's ``tree``, a config recorded by a run: it names
    the tracked runs that its process continued, which a resume decides anew from the checkpoint's
    record (``continued_run``: a branch or another store gets a new run)."""
    loggers = (tree.get("trainer") or {}).get("logger")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        init_args = spec.get("init_args") if isinstance(spec, dict) else None
        if isinstance(init_args, dict) and init_args.get("run_id") is not None:
            init_args["run_id"] = None

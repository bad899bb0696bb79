"""A run's records from its start to its end, on the parsed ``fit`` config: ``start`` before anything is
built (the loggers' packages, every MLflow store ready, the run directory created or continued, locked and
exported to the other ranks), ``start_mlflow_runs`` once the trainer is (every MLflow run named like the
run directory and tagged with what ran, ``git_sha`` the code that runs), ``TrackedConfig`` while it fits
(``config.yaml``, the params, where the run is recorded in each checkpoint) and ``end_started_runs`` when a
signal ends it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from lit_ppo.config import typed_key
from lit_ppo.run.continued import continued_run
from lit_ppo.run.lock import lock_run_dir
from lit_ppo.run.loggers import (
    MLflowRunLogger,
    WandbRunLogger,
    check_logger_dirs,
    check_logger_packages,
    mlflow_settings,
    tracking_setting,
)
from lit_ppo.run.mlflow_store import prepare_store
from lit_ppo.run.processes import RUN_DIR_ENV, launched_as_rank_zero
from lit_ppo.run.resume import CONFIG_STATE_KEY
from lit_ppo.run.run_dir import check_job_run_dir, job_run_dir, new_run_dir, what_ran
from lit_ppo.training.checkpoint_files import scale_lr
from lit_ppo.training.record import RECORD_KEY, RUN_KEY
from lit_ppo.utils.config_values import config_value
from lit_ppo.utils.fs import shown_path, write_file_atomically


def git_sha() -> str:
    """Short commit of the lit_ppo code that is running ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def start(config: Any) -> Path | None:
    """Before anything is instantiated from the parsed ``fit`` config: check that the loggers can work,
    make every MLflow store ready and, on rank 0, create the run directory (or continue the resumed
    checkpoint's), export it to the ranks Lightning will start and print it. Returns the run directory
    (None on a rank that learns it by broadcast at setup)."""
    if launched_as_rank_zero():
        check_job_run_dir()  # before any store or directory is written: a refusal leaves everything as it was
    check_logger_packages(config.trainer.logger)
    check_logger_dirs(config.trainer.logger)
    for cls, init_args in mlflow_settings(config):
        uri, source, name = tracking_setting(cls, init_args)
        if uri:
            prepare_store(uri, source, name, init_args.get("artifact_location"))
    if not launched_as_rank_zero():
        inherited = os.environ.get(RUN_DIR_ENV)
        return Path(inherited) if inherited else None
    path = continued_run(config) or job_run_dir() or new_run_dir(config)
    path = path.expanduser().absolute()
    lock_run_dir(path)  # before anything is written into it or its MLflow run
    os.environ[RUN_DIR_ENV] = str(path)
    print(f"run directory: {shown_path(path)}", file=sys.stderr, flush=True)
    return path


def run_tags(config: Any, trainer: Any, run_dir: Path) -> dict[str, str]:
    """The MLflow tags of a run, to filter and group runs by: what ran (algo, task, model, engine), on
    how many processes, with which code, and where its directory is."""
    return {**what_ran(config), "engine": str(config_value(config.data, "engine") or "none"),
            "world_size": str(trainer.world_size), "git_sha": git_sha(),
            "lit_ppo_version": importlib.metadata.version("lit_ppo"), "run_dir": os.path.abspath(run_dir)}


def start_mlflow_runs(trainer: Any, config: Any, run_dir: Path | None) -> None:
    """On rank 0, right after the trainer is built: start the run of every MLflow logger, named like
    the run directory, or mark a continued one RUNNING again; tag it with ``run_tags`` (the running
    code's ``git_sha`` whatever a replayed config says) and print its id. Lightning itself starts them
    before any callback's setup."""
    if run_dir is None or not launched_as_rank_zero():
        return
    tags = run_tags(config, trainer, run_dir)
    for logger in trainer.loggers:
        if isinstance(logger, WandbRunLogger):
            logger.add_tags(tags)
        if not isinstance(logger, MLFlowLogger):
            continue
        continuing = logger._run_id is not None
        if not continuing:
            # MLFlowLogger creates its run from these two attributes on first use of ``experiment``.
            logger._run_name = run_dir.name
            logger.tags = {**(logger.tags or {}), **tags}
        client, run_id = logger.experiment, logger.run_id
        _started_runs.append((client, run_id))
        if continuing:
            client.update_run(run_id, status="RUNNING")
            for key, value in tags.items():
                client.set_tag(run_id, key, value)
        experiment = client.get_experiment(logger.experiment_id).name
        print(f"mlflow run id: {run_id} ({client.tracking_uri}, experiment {experiment})", file=sys.stderr, flush=True)
        if isinstance(logger, MLflowRunLogger):
            logger.guard_store()


_started_runs: list[tuple[Any, str]] = []
"""(client, run id) of every MLflow run this process started or continued."""


def end_started_runs(status: str) -> None:
    """Mark every MLflow run this process started or continued ``status`` (e.g. KILLED: Lightning ends
    them FINISHED or FAILED, or not at all when a signal arrives before training starts). A store that
    fails here is left as it is: the command is ending for another reason, which it reports."""
    for client, run_id in _started_runs:
        try:
            client.set_terminated(run_id, status)
        except Exception:
            pass


def run_reference(trainer: Any) -> dict[str, str]:
    """Where the trainer's run is recorded, kept in its checkpoints so that a resume continues it: the
    run directory, the first MLflow run (id and tracking URI) and the first W&B run, as far as the run
    has them."""
    out = {}
    for callback in trainer.callbacks:
        if isinstance(callback, TrackedConfig) and callback.run_dir is not None:
            out["dir"] = os.path.abspath(callback.run_dir)
    if trainer.is_global_zero:  # the loggers of the other ranks hold no run
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger) and logger.run_id and "mlflow_run_id" not in out:
                out.update(mlflow_run_id=logger.run_id, mlflow_tracking_uri=logger.experiment.tracking_uri)
            if isinstance(logger, WandbRunLogger) and "wandb_run_id" not in out:
                out["wandb_run_id"] = logger.version
    return out


MAX_PARAM_CHARS = 500
"""Longer values (a callback list, a chat template) are cut: an MLflow param is for comparing runs."""


def config_params(tree: dict) -> dict[str, str]:
    """Every leaf of the resolved LightningCLI config as ``{key as the user types it: text}``, for
    MLflow params (a list or an empty mapping is one value): ``actor.eps_clip``, ``rollout.engine``,
    ``logger.init_args.run_name``, ``seed`` (``lit_ppo.config.typed_key``). The ``config`` entry, the
    temporary file the command line was written to, is left out."""
    flat: dict[str, str] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for child_key, child in value.items():
                walk(f"{key}.{child_key}" if key else str(child_key), child)
            return
        flat[typed_key(key)] = str(value)[:MAX_PARAM_CHARS]

    walk("", {k: v for k, v in tree.items() if k != "config"})
    return flat


class TrackedConfig(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory and as an artifact of every
    MLflow run; points checkpoints that name no ``dirpath`` at ``<run directory>/checkpoints``.

    Args:
        run_dir: this rank's run directory (None where rank 0's arrives by broadcast); the other
            arguments are SaveConfigCallback's.
    """

    def __init__(self, *args: Any, run_dir: str | Path | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.run_dir = Path(run_dir) if run_dir else None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # A collective on every rank: rank 0's directory is the run's. Callbacks set up before
        # checkpoint callbacks (Lightning orders those last), so their dirpath is still to resolve.
        chosen = trainer.strategy.broadcast(None if self.run_dir is None else str(self.run_dir), src=0)
        self.run_dir = Path(chosen)
        for checkpoint in trainer.checkpoint_callbacks:
            if getattr(checkpoint, "dirpath", "") is None:
                checkpoint.dirpath = str(self.run_dir / "checkpoints")
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        # A continued run keeps the config it started with; a resume's own goes beside it.
        text = self.parser.dump(self.config, skip_none=False)
        name, resumed = "config.yaml", None
        if (self.run_dir / name).exists():
            resumed = f"resumed-{time.strftime('%Y%m%d-%H%M%S')}"
            name = f"config-{resumed}.yaml"
        # Whole or not at all: the config is what a later validate / export reads (a full disk stops here).
        write_file_atomically(self.run_dir / name, lambda f: f.write(text.encode()), "config")
        for logger in trainer.loggers:
            run_id = getattr(logger, "run_id", None)
            if run_id and hasattr(logger.experiment, "log_text"):
                logger.experiment.log_text(run_id, text, name)
                params = config_params(self.config.clone().as_dict())
                if isinstance(logger, MLflowRunLogger):
                    logger.log_hyperparams(params, resumed=resumed)
                else:
                    logger.log_hyperparams(params)
            elif isinstance(logger, WandbRunLogger):
                logger.log_hyperparams(config_params(self.config.clone().as_dict()))
                logger.experiment.save(str(self.run_dir / name), base_path=str(self.run_dir), policy="now")

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # A resume's new learning rate reaches the optimizer and its schedule, whose state (restored after
        # this) holds the checkpoint's: scaled by new / old, the schedule's progress is kept.
        states = (checkpoint.get("callbacks") or {}).values()
        text = next((s[CONFIG_STATE_KEY] for s in states if isinstance(s, dict) and CONFIG_STATE_KEY in s), None)
        if text is None:
            return
        was, now = (yaml.safe_load(text) or {}).get("model") or {}, self.config.clone().as_dict().get("model") or {}
        trained = [section for section in ("actor", "critic") if now.get(section)]  # optimizer order: LitPPO's
        for index, section in enumerate(trained):
            old = ((was.get(section) or {}).get("optimizer") or {}).get("lr")
            new = now[section]["optimizer"]["lr"]
            if old and new != old and index < len(checkpoint.get("optimizer_states") or ()):
                scale_lr(checkpoint, index, new / old)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # Where the run is recorded goes into the checkpoint's record, so that a resume continues the run.
        checkpoint.setdefault(RECORD_KEY, {})[RUN_KEY] = run_reference(trainer)

    def state_dict(self) -> dict[str, str]:
        # Checkpoints carry the config that made them: ``validate --ckpt_path`` needs nothing else.
        return {CONFIG_STATE_KEY: self.parser.dump(self.config, skip_none=False)}

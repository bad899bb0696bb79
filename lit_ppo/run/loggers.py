"""The loggers a run's config names (``conf/logger/*.yaml``), and what a parsed config's ``trainer.logger``
says of them.

Lightning's MLflow, TensorBoard, CSV and W&B loggers placed and named like the run: their files go into
the run directory (``lit_ppo.run.run_dir``), the MLflow and W&B runs are named like it. What a printed
config leaves unset is resolved when the run starts: the tracking URI from ``MLFLOW_TRACKING_URI`` (else
``sqlite:///mlflow.db``), the experiment from ``MLFLOW_EXPERIMENT_NAME`` (else ``lit_ppo``). mlflow is
imported only by a run that tracks with it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from lit_ppo.errors import ConfigError
from lit_ppo.run.mlflow_store import DEFAULT_EXPERIMENT, resolve_experiment, resolve_tracking_uri, sqlite_file
from lit_ppo.run.processes import RUN_DIR_ENV
from lit_ppo.utils.config_values import config_mapping, config_value
from lit_ppo.utils.stop_requests import fail_after_iteration
from lit_ppo.utils.text import first_line


class MLflowRunLogger(MLFlowLogger):
    """Lightning's MLFlowLogger with its tracking settings resolved when the run starts rather than
    when a config is written, so a printed config replays against the environment it runs in.

    Args:
        experiment_name: MLflow experiment; None for ``MLFLOW_EXPERIMENT_NAME``, else ``lit_ppo``.
        tracking_uri: MLflow tracking URI; None for ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.
        run_name: what the run is, in place of ``<algo>-<task>-<model>``; the start time is appended
            either way and the MLflow run is named like its run directory.
        tags: tags of the MLflow run; ``git_sha`` is always the running code's.
        log_model: as MLFlowLogger: log checkpoints as artifacts (False, True or 'all').
        prefix: put at the beginning of metric keys.
        artifact_location: where a newly created experiment stores artifacts; None for MLflow's default.
        run_id: continue this existing MLflow run instead of starting one.
        on_error: what a failure of the tracking store during training does (its disk full, its server
            gone): 'stop' ends training at the iteration's end with ``last.ckpt`` and fails the command
            (exit code 1) naming the store; 'continue' trains on without tracking, saying so once.
    """

    def __init__(self, experiment_name: str | None = None, tracking_uri: str | None = None,
                 run_name: str | None = None, tags: dict[str, Any] | None = None,
                 log_model: Literal[True, False, "all"] = False, prefix: str = "",
                 artifact_location: str | None = None, run_id: str | None = None,
                 on_error: Literal["stop", "continue"] = "stop"):
        super().__init__(experiment_name=resolve_experiment(experiment_name), run_name=run_name,
                         tracking_uri=resolve_tracking_uri(tracking_uri), tags=tags, log_model=log_model,
                         prefix=prefix, artifact_location=artifact_location, run_id=run_id)
        self._continued = run_id is not None
        self.on_error = on_error
        self.failed = False

    def log_hyperparams(self, params: Any, resumed: str | None = None) -> None:
        """As MLFlowLogger; a continued run keeps the params it has (MLflow refuses to change one) and gets
        those it lacks; given ``resumed`` (the resume's label, ``resumed-<time>``), a value that the resume
        changed (such as trainer.max_steps) is logged beside the run's as ``<resumed>/<key>``."""
        if self.failed:
            return
        if self._continued:
            run = self.experiment.get_run(self.run_id)
            if run is None:  # the store failed (see guard_store)
                return
            flat, had = _flatten_dict(_convert_params(params)), run.data.params
            params = {k: v for k, v in flat.items() if k not in had}
            if resumed:
                params.update({f"{resumed}/{k}": v for k, v in flat.items()
                               if k in had and k not in RESUME_PARAMS and str(v)[:MLFLOW_PARAM_CHARS] != had[k]})
        super().log_hyperparams(params)

    def guard_store(self) -> None:
        """From now on (the run exists), a failing call to the tracking store is reported as ``on_error``
        says instead of raised wherever it happens (a metric, a text, an artifact, the final status)."""
        if not isinstance(self._mlflow_client, _GuardedClient):
            self._mlflow_client = _GuardedClient(self._mlflow_client, self._store_failed)
            # MLflow logs a failing SQL statement with its traceback before raising it: said here once, in one line.
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

    def _store_failed(self, error: Exception, call: str) -> None:
        self.failed = True
        database = sqlite_file(self._tracking_uri) if self._tracking_uri.startswith("sqlite:") else None
        if database and not os.path.exists(database):  # SQLAlchemy would speak of a missing table
            what = (f"tracking store {self._tracking_uri} failed: its database file {os.path.abspath(database)} was "
                    f"deleted while the run was tracked there (restore it from a backup and resume from last.ckpt, "
                    f"or resume with another tracking URI into a new MLflow run)")
        else:
            what = f"tracking store {self._tracking_uri} failed ({call}: {first_line(error)})"
        if self.on_error == "stop":
            fail_after_iteration(f"{what}: training stopped at the end of the iteration, which last.ckpt holds "
                                 f"(logger.init_args.on_error=continue trains on without tracking)")
        else:
            print(f"warning: {what}: training goes on without tracking (logger.init_args.on_error=continue)",
                  file=sys.stderr, flush=True)


MLFLOW_PARAM_CHARS = 250
"""MLFlowLogger stores a param's first 250 characters."""
RESUME_PARAMS = ("ckpt_path", "logger.init_args.run_id")
"""Params that every resume sets (the checkpoint, the run continued): no change of the run's settings."""


class _GuardedClient:
    """An MlflowClient whose failing calls go to ``on_failure(error, method name)`` and return None; after
    the first failure no call reaches the store (one report, no retries against a broken store)."""

    def __init__(self, client: Any, on_failure):
        self._client = client
        self._on_failure = on_failure
        self._failed = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._failed:
                return None
            try:
                return attr(*args, **kwargs)
            except Exception as e:  # MlflowException, sqlalchemy's, requests' and OSError alike
                self._failed = True
                self._on_failure(e, name)
                return None

        return call


def _in_run_dir(save_dir: str | None) -> str:
    """``save_dir``, else the run directory (ranks that learn it by broadcast write no logs)."""
    return save_dir or os.environ.get(RUN_DIR_ENV) or os.curdir


def _check_writable(directory: str, key: str) -> None:
    """ConfigError naming ``key`` when ``directory`` cannot be written (nor made): W&B would put its files in
    the system's temporary directory instead, saying so only in its debug log."""
    path = Path(directory).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        reason = f"{existing} is a file"
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:  # root may write anywhere else, and access() says so
        reason = f"{existing} is on a read-only filesystem"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = f"{existing} is not writable by this user"
    else:
        return
    raise ConfigError(f"{key}={directory} cannot be written ({reason}), and W&B would keep the run in the system's "
                      f"temporary directory instead: give a writable directory, or leave {key} unset for the run "
                      f"directory")


class TensorBoardRunLogger(TensorBoardLogger):
    """Lightning's TensorBoardLogger writing into the run directory: ``<run dir>/tensorboard/version_<n>/``
    (a resumed run adds the next version). Arguments as TensorBoardLogger; ``save_dir`` None for the run
    directory."""

    def __init__(self, save_dir: str | None = None, name: str = "tensorboard", version: int | str | None = None,
                 **kwargs: Any):
        super().__init__(_in_run_dir(save_dir), name=name, version=version, **kwargs)


class CSVRunLogger(CSVLogger):
    """Lightning's CSVLogger writing into the run directory: ``<run dir>/csv/version_<n>/metrics.csv`` (a
    resumed run adds the next version: Lightning deletes a metrics.csv it finds in its directory).
    Arguments as CSVLogger; ``save_dir`` None for the run directory."""

    def __init__(self, save_dir: str | None = None, name: str = "csv", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100):
        super().__init__(_in_run_dir(save_dir), name=name, version=version, prefix=prefix,
                         flush_logs_every_n_steps=flush_logs_every_n_steps)


WANDB_TAG_CHARS = 64
"""W&B refuses every tag of an update when one is longer."""


class WandbRunLogger(WandbLogger):
    """Lightning's WandbLogger named and placed like the run: the W&B run is named like the run directory,
    its local files go to ``<run dir>/wandb/``, and it gets the same params (the resolved config as typed
    on the command line), metrics and tags (``key=value``) as an MLflow run. A resumed run continues the
    W&B run its checkpoint recorded.

    Args:
        project: W&B project; None for ``WANDB_PROJECT``, else ``lit_ppo``.
        name: the W&B run's name; None for the run directory's name.
        save_dir: where W&B writes its local files (a ``wandb/`` folder); None for the run directory.
        offline: keep the run on this machine (``wandb sync <run dir>/wandb/offline-run-*`` uploads it
            later); W&B's ``WANDB_MODE=offline`` does the same.
        tags: tags of the W&B run, besides the run's own (algo, task, model, engine, world size, git_sha).
        log_model: as WandbLogger: upload checkpoints as artifacts (False, True or 'all').
        prefix: put at the beginning of metric keys.
        run_id: continue this existing W&B run instead of starting one.
        kwargs: more ``wandb.init`` arguments (entity, group, notes, ...).
    """

    def __init__(self, project: str | None = None, name: str | None = None, save_dir: str | None = None,
                 offline: bool = False, tags: list[str] | None = None,
                 log_model: Literal[True, False, "all"] = False, prefix: str = "", run_id: str | None = None,
                 **kwargs: Any):
        run_dir = os.environ.get(RUN_DIR_ENV)
        super().__init__(name=name or (Path(run_dir).name if run_dir else None), save_dir=_in_run_dir(save_dir),
                         offline=offline, id=run_id, project=project or os.environ.get("WANDB_PROJECT") or
                         DEFAULT_EXPERIMENT, log_model=log_model, prefix=prefix, tags=list(tags or []), **kwargs)

    def add_tags(self, tags: dict[str, str]) -> None:
        """Tag the run ``key=value`` (W&B tags are plain strings of at most 64 characters: a longer one, such
        as the run directory's path, is left out)."""
        run = self.experiment
        new = [f"{key}={value}" for key, value in tags.items() if len(f"{key}={value}") <= WANDB_TAG_CHARS]
        run.tags = tuple(dict.fromkeys([*(run.tags or ()), *new]))

    def finalize(self, status: str) -> None:
        """Finish the W&B run when the fit ends, its closing lines on stderr with its others (left to the end of
        the process, W&B prints them to stdout, after the run summary)."""
        super().finalize(status)
        if self._experiment is not None and rank_zero_only.rank == 0:
            with contextlib.redirect_stdout(sys.stderr):
                self._experiment.finish(exit_code=0 if status == "success" else 1)


# ---------------------------------------------------------------------------------------------
# the loggers of a parsed config
# ---------------------------------------------------------------------------------------------

def logger_specs(logger_config: Any) -> list[tuple[type, Any]]:
    """(class, spec) of every logger given by ``class_path`` in the parsed ``trainer.logger`` value."""
    specs = logger_config if isinstance(logger_config, list) else [logger_config]
    out = []
    for spec in specs:
        class_path = config_value(spec, "class_path")
        if not class_path:
            continue
        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type):
            out.append((cls, spec))
    return out


def mlflow_loggers(logger_config: Any) -> list[tuple[type, Any]]:
    """(class, spec) of every MLflow logger in the parsed ``trainer.logger`` value."""
    return [(cls, spec) for cls, spec in logger_specs(logger_config) if issubclass(cls, MLFlowLogger)]


def tracking_setting(cls: type, init_args: dict) -> tuple[str | None, str, str]:
    """(tracking URI or None for a file store, where it came from, experiment) as the logger resolves them."""
    configured = init_args.get("tracking_uri")
    source = ("logger.init_args.tracking_uri" if configured else
              "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI")
    if issubclass(cls, MLflowRunLogger):
        return resolve_tracking_uri(configured), source, resolve_experiment(init_args.get("experiment_name"))
    return configured, source, init_args.get("experiment_name") or "lightning_logs"


LOGGER_PACKAGES = ((TensorBoardLogger, ("tensorboard", "tensorboardX"), "tensorboard"),
                   (WandbLogger, ("wandb",), "wandb"))
"""(logger class, the modules any of which it works with, the package to install)."""


def check_logger_packages(logger_config: Any) -> None:
    """A logger without its package fails here, as one line, not in Lightning's constructor."""
    for cls, _ in logger_specs(logger_config):
        for base, modules, package in LOGGER_PACKAGES:
            if issubclass(cls, base) and all(importlib.util.find_spec(m) is None for m in modules):
                raise ConfigError(f"trainer.logger {cls.__name__} needs the {package} package, which is not "
                                  f"installed: pip install {package}")


def check_logger_dirs(logger_config: Any) -> None:
    """A W&B logger's ``save_dir`` that cannot be written fails here, as one line (``_check_writable``)."""
    for cls, spec in logger_specs(logger_config):
        save_dir = config_value(config_value(spec, "init_args"), "save_dir")
        if issubclass(cls, WandbLogger) and save_dir:
            _check_writable(str(save_dir), "logger.init_args.save_dir")


def mlflow_settings(config: Any) -> list[tuple[type, dict]]:
    """(class, init_args) of every MLflow logger of the parsed (or composed) ``fit`` config."""
    return [(cls, config_mapping(config_value(spec, "init_args")))
            for cls, spec in mlflow_loggers(config_value(config_value(config, "trainer"), "logger"))]


def tracking_uris(config: Any) -> list[str]:
    """The tracking URI of every MLflow logger of the parsed (or composed) ``fit`` config, as the run will
    resolve it."""
    return [uri for uri, _, _ in (tracking_setting(*logger) for logger in mlflow_settings(config)) if uri]

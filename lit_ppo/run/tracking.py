"""Where a run is recorded: its own directory and its MLflow run.

Every ``fit`` gets ``<trainer.default_root_dir>/<experiment>/<run name>/``, e.g.
``runs/lit_ppo/grpo-arithmetic-tiny-20261201-101500/``, holding its ``config.yaml`` and
``checkpoints/`` with or without MLflow; the MLflow run has the same name. The directory is created
with an exclusive ``mkdir`` (``-2``, ``-3``, ... on a collision), so concurrent runs never share one.
Rank 0 chooses it before Lightning starts the other ranks, which inherit it through
``LIT_PPO_RUN_DIR``; ranks started by an external launcher receive it by broadcast at setup. A Slurm
job's directory is chosen when it is submitted (``LIT_PPO_JOB_RUN_DIR``, lit_ppo.schedulers.slurm) and
taken by that job only (``_job_run_dir``).

Resuming (``--ckpt_path``) continues the run the checkpoint records (``run_reference``, stored in its
``lit_ppo`` record): the same directory, whose ``config.yaml`` stays the config the run started with
(the resuming config is saved beside it as ``config-resumed-<time>.yaml``), and the same MLflow run,
RUNNING again, a setting the resume changed logged beside the run's params. A checkpoint that branches
from its run (older than the run's newest, or outside its directory) starts a new run directory and
MLflow run, and a run directory that is gone or an MLflow run not in the current store a new run, each
with one line on stderr saying why. ``--ckpt_path last`` is resolved here (``last_checkpoint``).

What a printed config leaves unset is resolved here, when the run starts: the tracking URI from
``MLFLOW_TRACKING_URI`` (else ``sqlite:///mlflow.db``), the experiment from ``MLFLOW_EXPERIMENT_NAME``
(else ``lit_ppo``), the ``git_sha`` tag from the code that runs. mlflow is imported only by a run
that tracks with it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from lit_ppo.config import typed_key
from lit_ppo.errors import ConfigError, TrackingError
from lit_ppo.run.lock import lock_run_dir
from lit_ppo.run.mlflow_store import DEFAULT_EXPERIMENT, prepare_store, resolve_experiment, resolve_tracking_uri
from lit_ppo.run.resume import CONFIG_STATE_KEY, checkpoint_step, recorded_run
from lit_ppo.training.checkpoint_io import PERIODIC_NAME
from lit_ppo.training.record import RECORD_KEY, RUN_KEY
from lit_ppo.utils.fs import shown_path, write_file_atomically
from lit_ppo.utils.imports import is_object_reference
from lit_ppo.utils.stop_requests import fail_after_iteration
from lit_ppo.utils.text import first_line

RUN_DIR_ENV = "LIT_PPO_RUN_DIR"
JOB_RUN_DIR_ENV = "LIT_PPO_JOB_RUN_DIR"
"""A batch job's run directory, fixed when the job was submitted (lit_ppo.schedulers.slurm): rank 0 of
every start of that job takes it instead of creating one (``_job_run_dir``)."""
# Environment variables through which launchers tell a process its rank (Lightning's DDP launcher:
# LOCAL_RANK; torchrun: RANK, GROUP_RANK; SLURM: SLURM_PROCID; other nodes: NODE_RANK; LSF).
RANK_ENV = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def git_sha() -> str:
    """Short commit of the lit_ppo code that is running ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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

    def _store_failed(self, error: Exception, call: str) -> None:
        self.failed = True
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
# the run directory
# ---------------------------------------------------------------------------------------------

def _component(text: str) -> str:
    """``text`` as one file name: characters other than letters, digits, '_', '.', '-' become '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._") or "none"


def _short(text: str) -> str:
    """The telling part of a task or model setting: a local path's last part, a dotted name's last (of a
    Python object's reference too: ``python:__main__.Doubling`` is ``Doubling``)."""
    if is_object_reference(text):
        return _component(text.split("#")[0].rsplit(".", 1)[-1])
    text = os.path.basename(str(text).rstrip("/"))
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*){2,}", text):  # package.module.Name (a file has one dot)
        text = text.rsplit(".", 1)[1]
    return _component(text)


def run_name(description: str, when: float | None = None) -> str:
    """``<description>-<YYYYmmdd-HHMMSS>`` in local time."""
    return f"{_component(description)}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}"


def create_run_dir(root: str | Path, experiment: str, name: str) -> Path:
    """``root/experiment/name``, created by this call and no other: the first of ``name``, ``name-2``,
    ``name-3``, ... that does not exist yet (``mkdir`` either creates a directory or fails, atomically,
    so runs that start in the same second in one place never share a directory)."""
    parent = Path(root) / _component(experiment)
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


def launched_as_rank_zero() -> bool:
    """Whether no launcher started this process as a rank other than 0."""
    return all(os.environ.get(key, "0") in ("", "0") for key in RANK_ENV)


# ---------------------------------------------------------------------------------------------
# from the parsed config to a started run
# ---------------------------------------------------------------------------------------------

def _as_dict(value: Any) -> dict:
    if value is None:
        return {}
    return dict(vars(value)) if not isinstance(value, dict) else dict(value)


def _get(node: Any, key: str) -> Any:
    """``node[key]`` of a dict, else its attribute (a parsed Namespace, a dataclass); None if absent."""
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def _set(node: Any, key: str, value: Any) -> None:
    """``node[key] = value`` of a dict, else set its attribute (a parsed Namespace)."""
    if isinstance(node, dict):
        node[key] = value
    else:
        setattr(node, key, value)


def _logger_specs(logger_config: Any) -> list[tuple[type, Any]]:
    """(class, spec) of every logger given by ``class_path`` in the parsed ``trainer.logger`` value."""
    specs = logger_config if isinstance(logger_config, list) else [logger_config]
    out = []
    for spec in specs:
        class_path = _get(spec, "class_path")
        if not class_path:
            continue
        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type):
            out.append((cls, spec))
    return out


def _mlflow_loggers(logger_config: Any) -> list[tuple[type, Any]]:
    """(class, spec) of every MLflow logger in the parsed ``trainer.logger`` value."""
    return [(cls, spec) for cls, spec in _logger_specs(logger_config) if issubclass(cls, MLFlowLogger)]


def _tracking_setting(cls: type, init_args: dict) -> tuple[str | None, str, str]:
    """(tracking URI or None for a file store, where it came from, experiment) as the logger resolves them."""
    configured = init_args.get("tracking_uri")
    source = ("logger.init_args.tracking_uri" if configured else
              "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI")
    if issubclass(cls, MLflowRunLogger):
        return resolve_tracking_uri(configured), source, resolve_experiment(init_args.get("experiment_name"))
    return configured, source, init_args.get("experiment_name") or "lightning_logs"


LOGGER_PACKAGES = ((TensorBoardLogger, ("tensorboard", "tensorboardX"), "tensorboard"), (WandbLogger, ("wandb",), "wandb"))
"""(logger class, the modules any of which it works with, the package to install)."""


def _check_logger_packages(logger_config: Any) -> None:
    """A logger without its package fails here, as one line, not in Lightning's constructor."""
    for cls, _ in _logger_specs(logger_config):
        for base, modules, package in LOGGER_PACKAGES:
            if issubclass(cls, base) and all(importlib.util.find_spec(m) is None for m in modules):
                raise ConfigError(f"trainer.logger {cls.__name__} needs the {package} package, which is not "
                                  f"installed: pip install {package}")


def _what_ran(config: Any) -> dict[str, str]:
    """algo, task and model of the parsed ``fit`` config, task and model shortened as in run names."""
    model, data = _get(config, "model"), _get(config, "data")
    weights = _get(_get(model, "model"), "source") or "tiny"
    return {"algo": str(_get(model, "algo")), "task": _short(_get(data, "task")), "model": _short(weights)}


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
    newest = max((_saved_step(path) for path in checkpoint.parent.iterdir()
                  if path.name.endswith(".ckpt") and not path.name.startswith(".")), default=step)
    return f"{where} (which has gone on to iteration {newest})" if newest > step else None


def _saved_step(path: Path) -> int:
    """The iteration of a checkpoint file of a run: from its name (``epoch=0-step=20.ckpt``), else from
    its content (``last.ckpt``); -1 for one that cannot be read."""
    named = PERIODIC_NAME.match(path.name)
    if named:
        return int(named.group(1))
    try:
        return checkpoint_step(path)
    except Exception:  # a damaged file is no newer state of the run
        return -1


def _continued_run(config: Any) -> Path | None:
    """On a resume, the checkpoint's run directory, its MLflow run set as the first MLflow logger's
    ``run_id``; a new run directory for a checkpoint that branches from its run (``_branch``); None (with a
    one-line note when a checkpoint was given) to start a new run."""
    ckpt_path = _get(config, "ckpt_path")
    record = recorded_run(ckpt_path)
    if record is None:
        return None
    run_dir, run_id = record.get("dir"), record.get("mlflow_run_id")
    loggers = _mlflow_loggers(config.trainer.logger)[:1]
    missing = None
    if not run_dir:
        missing = "it records no run directory"
    elif not os.path.isdir(run_dir):
        missing = f"its run directory {run_dir} is gone"
    elif (branch := _branch(ckpt_path, run_dir)) is not None:
        path = new_run_dir(config)
        print(f"note: {branch}: new run directory {shown_path(path)}", file=sys.stderr, flush=True)
        return path
    elif loggers and run_id and not _get(_get(loggers[0][1], "init_args"), "run_id"):
        cls, spec = loggers[0]
        uri, _, experiment = _tracking_setting(cls, _as_dict(_get(spec, "init_args")))
        missing = _missing_mlflow_run(uri, experiment, run_id, record.get("mlflow_tracking_uri"))
        if missing is None:
            _set(_get(spec, "init_args"), "run_id", run_id)
    if missing is not None:
        print(f"note: --ckpt_path {ckpt_path}: {missing}: starting a new run", file=sys.stderr, flush=True)
        return None
    wandb_loggers = [spec for cls, spec in _logger_specs(config.trainer.logger) if issubclass(cls, WandbRunLogger)]
    if wandb_loggers and record.get("wandb_run_id") and not _get(_get(wandb_loggers[0], "init_args"), "run_id"):
        _set(_get(wandb_loggers[0], "init_args"), "run_id", record["wandb_run_id"])
    return Path(run_dir)


def forget_continued_runs(tree: dict) -> None:
    """Unset the ``run_id`` of every logger of LightningCLI's ``tree``, a config recorded by a run: it names
    the tracked runs that its process continued, which a resume decides anew from the checkpoint's
    record (``_continued_run``: a branch or another store gets a new run)."""
    loggers = (tree.get("trainer") or {}).get("logger")
    for spec in loggers if isinstance(loggers, list) else [loggers]:
        init_args = spec.get("init_args") if isinstance(spec, dict) else None
        if isinstance(init_args, dict) and init_args.get("run_id") is not None:
            init_args["run_id"] = None


def _mlflow_settings(config: Any) -> list[tuple[type, dict]]:
    """(class, init_args) of every MLflow logger of the parsed (or composed) ``fit`` config."""
    return [(cls, _as_dict(_get(spec, "init_args")))
            for cls, spec in _mlflow_loggers(_get(_get(config, "trainer"), "logger"))]


def tracking_uris(config: Any) -> list[str]:
    """The tracking URI of every MLflow logger of the parsed (or composed) ``fit`` config, as the run will
    resolve it."""
    return [uri for uri, _, _ in (_tracking_setting(*logger) for logger in _mlflow_settings(config)) if uri]


def _run_place(config: Any) -> tuple[Path, str, str]:
    """(root, experiment, description) of the runs of the parsed (or composed) ``fit`` config: their
    directories are ``<root>/<experiment>/<description>-<start time>``; the experiment and description are
    the first MLflow logger's experiment and run name, else ``<algo>-<task>-<model>``."""
    loggers = _mlflow_settings(config)
    experiment = _tracking_setting(*loggers[0])[2] if loggers else resolve_experiment(None)
    prefixes = [init_args.get("run_name") for _, init_args in loggers if init_args.get("run_name")]
    description = prefixes[0] if prefixes else "-".join(_short(part) for part in _what_ran(config).values())
    # Absolute, '~' expanded: checkpoints record where they are, and a resume (which may start elsewhere)
    # must find the same directory under the same name, or Lightning versions last.ckpt aside.
    root = Path(_get(_get(config, "trainer"), "default_root_dir") or "runs").expanduser().absolute()
    return root, experiment, description


def new_run_dir(config: Any) -> Path:
    """A new ``<trainer.default_root_dir>/<experiment>/<run name>`` for the parsed (or composed) ``fit``
    config (``_run_place``)."""
    root, experiment, description = _run_place(config)
    return create_run_dir(root, experiment, run_name(description))


def last_checkpoint(config: Any) -> Path:
    """What ``--ckpt_path last`` resumes: of the run directories named like the runs of the parsed (or
    composed) ``fit`` config, ``<root>/<experiment>/<description>-<start time>[-n]``, the ``last.ckpt``
    written last. ConfigError when none holds one."""
    root, experiment, description = _run_place(config)
    parent = root / _component(experiment)
    named = re.compile(rf"{re.escape(_component(description))}-\d{{8}}-\d{{6}}(-\d+)?")
    found = [d / "checkpoints" / "last.ckpt" for d in (parent.iterdir() if parent.is_dir() else ())
             if named.fullmatch(d.name)]
    found = [path for path in found if path.exists()]
    if not found:
        raise ConfigError(f"--ckpt_path last: no run directory {parent / _component(description)}-<time> holds a "
                          f"checkpoints/last.ckpt: give the path of the checkpoint to resume")
    return max(found, key=lambda path: path.stat().st_mtime)


def start(config: Any) -> Path | None:
    """Before anything is instantiated from the parsed ``fit`` config: check that the loggers can work,
    make every MLflow store ready and, on rank 0, create the run directory (or continue the resumed
    checkpoint's), export it to the ranks Lightning will start and print it. Returns the run directory
    (None on a rank that learns it by broadcast at setup)."""
    _check_logger_packages(config.trainer.logger)
    for cls, init_args in _mlflow_settings(config):
        uri, source, name = _tracking_setting(cls, init_args)
        if uri:
            prepare_store(uri, source, name, init_args.get("artifact_location"))
    if not launched_as_rank_zero():
        inherited = os.environ.get(RUN_DIR_ENV)
        return Path(inherited) if inherited else None
    path = _continued_run(config) or _job_run_dir() or new_run_dir(config)
    path = path.expanduser().absolute()
    lock_run_dir(path)  # before anything is written into it or its MLflow run
    os.environ[RUN_DIR_ENV] = str(path)
    print(f"run directory: {shown_path(path)}", file=sys.stderr, flush=True)
    return path


JOB_MARKER = ".job"
"""File of a job's run directory naming the Slurm job (``SLURM_JOB_ID``, empty elsewhere) that took it."""


def _job_run_dir() -> Path | None:
    """The batch job's directory (``LIT_PPO_JOB_RUN_DIR``), where it is this process's: one that holds no run
    yet (the job's first start, which marks it as the job's), or one that the same Slurm job took before (a
    requeued job). A value left in another shell names a directory holding another run: None, said in one
    line, so that a fresh fit never writes into that run."""
    scheduled = os.environ.get(JOB_RUN_DIR_ENV)
    if not scheduled:
        return None
    path = Path(scheduled).expanduser().absolute()
    job = os.environ.get("SLURM_JOB_ID", "")
    marker = path / JOB_MARKER
    if path.is_dir() and not marker.exists() and not (path / "config.yaml").exists():
        marker.write_text(job)
        return path
    if job and marker.is_file() and marker.read_text().strip() == job:
        return path
    print(f"note: {JOB_RUN_DIR_ENV}={scheduled} is not this process's job directory (it holds another run, or is "
          f"gone): starting a new run", file=sys.stderr, flush=True)
    return None


def run_tags(config: Any, trainer: Any, run_dir: Path) -> dict[str, str]:
    """The MLflow tags of a run, to filter and group runs by: what ran (algo, task, model, engine), on
    how many processes, with which code, and where its directory is."""
    return {**_what_ran(config), "engine": str(_get(config.data, "engine")), "world_size": str(trainer.world_size),
            "git_sha": git_sha(), "lit_ppo_version": importlib.metadata.version("lit_ppo"),
            "run_dir": os.path.abspath(run_dir)}


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
                _scale_lr(checkpoint, index, new / old)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # Where the run is recorded goes into the checkpoint's record, so that a resume continues the run.
        checkpoint.setdefault(RECORD_KEY, {})[RUN_KEY] = run_reference(trainer)

    def state_dict(self) -> dict[str, str]:
        # Checkpoints carry the config that made them: ``validate --ckpt_path`` needs nothing else.
        return {CONFIG_STATE_KEY: self.parser.dump(self.config, skip_none=False)}


def _scale_lr(checkpoint: dict, index: int, factor: float) -> None:
    """Multiply the learning rates of optimizer ``index`` of a loaded ``checkpoint`` and of its schedule
    (current, initial and base) by ``factor``."""
    for group in checkpoint["optimizer_states"][index]["param_groups"]:
        for key in ("lr", "initial_lr"):
            if key in group:
                group[key] *= factor
    schedulers = checkpoint.get("lr_schedulers") or []
    if index < len(schedulers):
        for key in ("base_lrs", "_last_lr"):
            if key in schedulers[index]:
                schedulers[index][key] = [lr * factor for lr in schedulers[index][key]]

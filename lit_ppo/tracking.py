"""Where a run is recorded: its own directory and its MLflow run.

Every ``fit`` gets ``<trainer.default_root_dir>/<experiment>/<run name>/``, e.g.
``runs/lit_ppo/grpo-arithmetic-tiny-20261201-101500/``, holding its ``config.yaml`` and
``checkpoints/`` with or without MLflow; the MLflow run has the same name. The directory is created
with an exclusive ``mkdir`` (``-2``, ``-3``, ... on a collision), so concurrent runs never share one.
Rank 0 chooses it before Lightning starts the other ranks, which inherit it through
``LIT_PPO_RUN_DIR``; ranks started by an external launcher receive it by broadcast at setup.

What a printed config leaves unset is resolved here, when the run starts: the tracking URI from
``MLFLOW_TRACKING_URI`` (else ``sqlite:///mlflow.db``), the experiment from ``MLFLOW_EXPERIMENT_NAME``
(else ``lit_ppo``), the ``git_sha`` tag from the code that runs. mlflow is imported only by a run
that tracks with it.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from lit_ppo.cli_errors import ConfigError

RUN_DIR_ENV = "LIT_PPO_RUN_DIR"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "lit_ppo"
# Environment variables through which launchers tell a process its rank (Lightning's DDP launcher:
# LOCAL_RANK; torchrun: RANK, GROUP_RANK; SLURM: SLURM_PROCID; other nodes: NODE_RANK; LSF).
RANK_ENV = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
# MLflow's own client retries an unreachable server for minutes; the probe answers in seconds.
PROBE_TIMEOUT_S = 10.0
# Creating or migrating a fresh sqlite store takes seconds; a lock held this long is a stuck process.
STORE_LOCK_TIMEOUT_S = 120.0


class TrackingError(ConfigError):
    """The tracking store cannot be used; reported as one line (exit code 2) before any model loads."""


def git_sha() -> str:
    """Short commit of the lit_ppo code that is running ('unknown' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def resolve_tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def resolve_experiment(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


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
    """

    def __init__(self, experiment_name: str | None = None, tracking_uri: str | None = None,
                 run_name: str | None = None, tags: dict[str, Any] | None = None,
                 log_model: Literal[True, False, "all"] = False, prefix: str = "",
                 artifact_location: str | None = None, run_id: str | None = None):
        super().__init__(experiment_name=resolve_experiment(experiment_name), run_name=run_name,
                         tracking_uri=resolve_tracking_uri(tracking_uri), tags=tags, log_model=log_model,
                         prefix=prefix, artifact_location=artifact_location, run_id=run_id)


# ---------------------------------------------------------------------------------------------
# the run directory
# ---------------------------------------------------------------------------------------------

def _component(text: str) -> str:
    """``text`` as one file name: characters other than letters, digits, '_', '.', '-' become '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._") or "none"


def _short(text: str) -> str:
    """The telling part of a task or model setting: a local path's last part, a dotted name's last."""
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
    parent.mkdir(parents=True, exist_ok=True)
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
# the MLflow store
# ---------------------------------------------------------------------------------------------

def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _sqlite_file(uri: str) -> str | None:
    """The database file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URI (None in memory)."""
    rest = uri[len("sqlite://"):].split("?", 1)[0]
    return rest[1:] if rest.startswith("/") and rest[1:] not in ("", ":memory:") else None


def _probe(uri: str, source: str) -> None:
    """Fail at once when nothing answers at ``uri``; any HTTP answer (an error status included) counts."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise TrackingError(f"MLflow tracking server {uri} is unreachable ({source}): {reason}") from None


def _ensure_experiment(uri: str, experiment: str, artifact_location: str | None) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)  # builds the store: creates or migrates a fresh database
    found = client.get_experiment_by_name(experiment)
    if found is not None and found.lifecycle_stage == "deleted":
        raise TrackingError(f"MLflow experiment {experiment!r} is deleted in {uri}: restore it (mlflow experiments "
                            "restore) or choose another name (MLFLOW_EXPERIMENT_NAME)")
    if found is None:
        try:
            client.create_experiment(experiment, artifact_location=artifact_location)
        except MlflowException as e:  # another run created it since
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def prepare_store(uri: str, source: str, experiment: str, artifact_location: str | None = None) -> None:
    """Make ``uri`` ready for a run of ``experiment`` before any model loads: a server must answer;
    a sqlite database is created, migrated and given the experiment under ``<db>.lock``, because
    MLflow's schema migrations race when two runs open one fresh database at once. ``source`` names
    where ``uri`` came from, for the error message."""
    scheme = uri.split(":", 1)[0].lower()
    lock: Any = contextlib.nullcontext()
    if scheme in ("http", "https"):
        _probe(uri, source)
    elif scheme == "sqlite":
        database = _sqlite_file(uri)
        if database:
            from filelock import FileLock

            lock = FileLock(database + ".lock", timeout=STORE_LOCK_TIMEOUT_S)
    else:
        return  # other stores (databricks, ...) are MLflow's business
    try:
        with lock:
            _ensure_experiment(uri, experiment, artifact_location)
    except TrackingError:
        raise
    except Exception as e:  # whatever the store says, as one line
        raise TrackingError(f"MLflow tracking store {uri} ({source}) cannot be used: {_first_line(e)}") from None


# ---------------------------------------------------------------------------------------------
# from the parsed config to a started run
# ---------------------------------------------------------------------------------------------

def _as_dict(value: Any) -> dict:
    if value is None:
        return {}
    return dict(vars(value)) if not isinstance(value, dict) else dict(value)


def _mlflow_loggers(logger_config: Any) -> list[tuple[type, dict]]:
    """(class, init_args) of every MLflow logger in the parsed ``trainer.logger`` value."""
    specs = logger_config if isinstance(logger_config, list) else [logger_config]
    out = []
    for spec in specs:
        class_path = getattr(spec, "class_path", None) or (spec.get("class_path") if isinstance(spec, dict) else None)
        if not class_path:
            continue
        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, MLFlowLogger):
            init_args = getattr(spec, "init_args", None) if not isinstance(spec, dict) else spec.get("init_args")
            out.append((cls, _as_dict(init_args)))
    return out


def _tracking_setting(cls: type, init_args: dict) -> tuple[str | None, str, str]:
    """(tracking URI or None for a file store, where it came from, experiment) as the logger resolves them."""
    configured = init_args.get("tracking_uri")
    source = ("logger.init_args.tracking_uri" if configured else
              "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI")
    if issubclass(cls, MLflowRunLogger):
        return resolve_tracking_uri(configured), source, resolve_experiment(init_args.get("experiment_name"))
    return configured, source, init_args.get("experiment_name") or "lightning_logs"


def start(config: Any) -> Path | None:
    """Before anything is instantiated from the parsed ``fit`` config: make every MLflow store ready
    and, on rank 0, create the run directory, export it to the ranks Lightning will start and print
    it. Returns the run directory (None on a rank that learns it by broadcast at setup)."""
    loggers = _mlflow_loggers(config.trainer.logger)
    experiment = None
    for cls, init_args in loggers:
        uri, source, name = _tracking_setting(cls, init_args)
        experiment = experiment or name
        if uri:
            prepare_store(uri, source, name, init_args.get("artifact_location"))
    if not launched_as_rank_zero():
        inherited = os.environ.get(RUN_DIR_ENV)
        return Path(inherited) if inherited else None
    prefixes = [init_args.get("run_name") for _, init_args in loggers if init_args.get("run_name")]
    model = config.model.model
    weights = getattr(model, "source", None) or (model.get("source") if isinstance(model, dict) else None) or "tiny"
    description = prefixes[0] if prefixes else "-".join(
        _short(part) for part in (config.model.algo, config.data.task, weights))
    root = config.trainer.default_root_dir or "runs"
    path = create_run_dir(root, experiment or resolve_experiment(None), run_name(description))
    os.environ[RUN_DIR_ENV] = os.path.abspath(path)
    print(f"run directory: {path}", file=sys.stderr, flush=True)
    return path


def start_mlflow_runs(loggers: list, run_dir: Path | None) -> None:
    """On rank 0, right after the trainer is built: start the run of every MLflow logger, named like
    the run directory and tagged with the running code's ``git_sha`` (whatever a replayed config
    says), and print its id. Lightning itself starts them before any callback's setup."""
    if run_dir is None or not launched_as_rank_zero():
        return
    sha = git_sha()
    for logger in loggers:
        if not isinstance(logger, MLFlowLogger):
            continue
        continuing = logger._run_id is not None
        if not continuing:
            # MLFlowLogger creates its run from these two attributes on first use of ``experiment``.
            logger._run_name = run_dir.name
            logger.tags = {**(logger.tags or {}), "git_sha": sha, "run_dir": os.path.abspath(run_dir)}
        client, run_id = logger.experiment, logger.run_id
        if continuing:
            client.set_tag(run_id, "git_sha", sha)
        experiment = client.get_experiment(logger.experiment_id).name
        print(f"mlflow run id: {run_id} ({client.tracking_uri}, experiment {experiment})", file=sys.stderr, flush=True)


CONFIG_SECTIONS = (("model.actor.", "actor."), ("model.critic.", "critic."), ("model.model.", "model."),
                   ("model.algo", "algo"), ("data.gconfig.", "gconfig."), ("seed_everything", "seed"))
"""LightningCLI key prefix -> the name the user types (``python -m lit_ppo fit actor.eps_clip=...``)."""
MAX_PARAM_CHARS = 500
"""Longer values (a callback list, a chat template) are cut: an MLflow param is for comparing runs."""


def config_params(tree: dict) -> dict[str, str]:
    """Every leaf of the resolved LightningCLI config as ``{key as the user types it: text}``, for
    MLflow params (a list or an empty mapping is one value)."""
    flat: dict[str, str] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for child_key, child in value.items():
                walk(f"{key}.{child_key}" if key else str(child_key), child)
            return
        for lightning, typed in CONFIG_SECTIONS:
            if key.startswith(lightning):
                key = typed + key[len(lightning):]
                break
        flat[key] = str(value)[:MAX_PARAM_CHARS]

    walk("", tree)
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
        text = self.parser.dump(self.config, skip_none=False)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(text)
        for logger in trainer.loggers:
            run_id = getattr(logger, "run_id", None)
            if run_id and hasattr(logger.experiment, "log_text"):
                logger.experiment.log_text(run_id, text, "config.yaml")
                logger.log_hyperparams(config_params(self.config.clone().as_dict()))

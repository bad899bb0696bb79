"""``scheduler=ray``: ``python -m lit_ppo fit <overrides> scheduler=ray scheduler.num_workers=2`` runs the
fit as a Ray Train job of ``num_workers`` workers, one rank each, on a local Ray cluster that
``ray.init()`` starts (``scheduler.address`` null) or on an existing one (``scheduler.address``).

This command is the job's driver. It validates the config exactly as a local fit does (no model
loads), connects to Ray, creates the run's directory and starts Ray Train's ``TorchTrainer``. Every
worker runs the same fit from the same composed config, with what Ray's Lightning integration asks
for: ``RayDDPStrategy``, the ``RayLightningEnvironment`` plugin and ``prepare_trainer``; Ray starts the
worker processes and sets up their process group (gloo on CPU, NCCL on GPU); nothing else launches
processes. Each worker is one rank with one device (``trainer.devices=1``), so the world size is
``num_workers``; each has its own rollout engine, as every rank has under DDP.

- The run directory reaches the workers as ``LIT_PPO_JOB_RUN_DIR``: rank 0 takes it
  (lit_ppo.run.tracked_run.start), the other ranks receive it by broadcast at setup (TrackedConfig). Rank 0
  alone writes the config, checkpoints' run record and the one MLflow run, as under any launcher.
  Ray Train's own bookkeeping goes to ``<run dir>/ray``.
- The workers work in the driver's directory, so relative paths (``runs/``, ``sqlite:///mlflow.db``,
  data files) mean what they mean here; on a multi-node cluster that directory, the run directory
  and the data must be at the same path on every node (a shared filesystem), and lit_ppo installed
  in the cluster's Python. The driver's ``MLFLOW_*`` and ``LIT_PPO_*`` settings travel with the job.
- Resuming (``--ckpt_path``) works as locally: the workers' rank 0 continues the checkpoint's run
  directory and MLflow run.
- SIGINT / SIGTERM to this driver stop the job as they stop a local fit: every worker finishes the
  iteration, last.ckpt is written, the MLflow run is marked KILLED and the driver exits 128 + the
  signal number. The workers learn of the signal from a small Ray actor that they read at every
  iteration's end (Ray runs the fit in a worker thread, where no signal handler can be set). A second
  signal stops at once: Ray ends the job's processes with the driver (and with a local cluster).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from lit_ppo.config.scheduler import RayConfig
from lit_ppo.errors import ConfigError
from lit_ppo.run.processes import RUN_DIR_ENV
from lit_ppo.run.resume import recorded_run
from lit_ppo.run.run_dir import JOB_RUN_DIR_ENV, RAY_STORAGE, new_run_dir
from lit_ppo.utils.flags import flag_value

STRATEGIES = ("auto", "ddp")
"""trainer.strategy values a Ray job runs (as RayDDPStrategy); FSDP is not supported here yet."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)
PROBE_TIMEOUT_S = 10
"""Seconds to wait for a TCP answer from ``scheduler.address`` (Ray itself retries for minutes)."""


def check_strategy(trainer: dict) -> None:
    """ConfigError for a ``trainer.strategy`` that Ray jobs do not run (checked before the trainer
    settings themselves, which Ray's replace)."""
    strategy = trainer.get("strategy", "auto")
    if strategy not in STRATEGIES:
        name = strategy.get("class_path", strategy) if isinstance(strategy, dict) else strategy
        raise ConfigError(f"trainer.strategy={name} is not supported with scheduler=ray: it runs "
                          f"trainer=ddp or trainer=cpu (data parallel, one rank per worker)")


def job_trainer(cfg: RayConfig, trainer: dict) -> dict:
    """The trainer settings of each worker (over those of ``trainer``): one rank on one device; the
    strategy becomes Ray's DDP on the workers."""
    check_strategy(trainer)
    return {"accelerator": "gpu" if cfg.gpus_per_worker else "cpu", "devices": 1, "num_nodes": 1,
            "strategy": "ddp"}


def submit(cfg: RayConfig, overrides: list[str], flags: list[str], tree: dict,
           worker_fit: Callable[[dict], None]) -> int:
    """Run the fit of ``tree`` (with LightningCLI ``flags``) as a Ray Train job whose workers each run
    ``worker_fit(job)`` (the CLI's, pickled by its module path); the exit code."""
    tree["trainer"].update(job_trainer(cfg, tree["trainer"]))
    try:
        import ray
    except ImportError:
        raise ConfigError("scheduler=ray needs Ray Train, which is not installed: pip install -r "
                          "requirements.txt (ray[train])") from None
    _connect(ray, cfg.address)
    try:
        return _run_job(ray, cfg, tree, flags, worker_fit)
    finally:
        ray.shutdown()  # a local cluster stops with it; on an existing one the job's actors end


def _connect(ray: Any, address: str | None) -> None:
    """``ray.init`` for ``address``; ConfigError when no cluster answers there."""
    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
        except OSError as e:
            raise ConfigError(f"scheduler.address={address}: no Ray cluster answers there "
                              f"({e.strerror or e})") from None
    try:
        if address is None:
            # The job's own cluster: its progress is in this terminal and in MLflow, not a dashboard.
            ray.init(include_dashboard=False)
        else:
            ray.init(address=address)
    except ConnectionError as e:
        raise ConfigError(f"scheduler.address={address}: {str(e).splitlines()[0]}") from None


def _run_job(ray: Any, cfg: RayConfig, tree: dict, flags: list[str], worker_fit: Callable[[dict], None]) -> int:
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    env = {k: v for k, v in os.environ.items() if k.startswith(("MLFLOW_", "LIT_PPO_")) and k != RUN_DIR_ENV}
    resumed = (recorded_run(flag_value(flags, "--ckpt_path")) or {}).get("dir")
    if resumed and os.path.isdir(resumed):
        run_dir = Path(resumed)  # the workers' rank 0 continues the run there, as a local resume does
    else:
        run_dir = new_run_dir(tree).absolute()
        env[JOB_RUN_DIR_ENV] = str(run_dir)
        print(f"run directory: {run_dir}", file=sys.stderr, flush=True)
    # Each worker's output once, as printed (Ray Train's print patch repeats every line through a logger).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    stop = ray.remote(num_cpus=0)(StopRequest).remote()
    job = {"tree": tree, "flags": flags, "cwd": os.getcwd(), "env": env, "stop": stop}
    trainer = TorchTrainer(
        worker_fit, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=bool(cfg.gpus_per_worker),
                                     resources_per_worker=cfg.resources_per_worker),
        # A failed rank fails the job: a restart would be a resume, which is the user's --ckpt_path.
        run_config=RunConfig(name=RAY_STORAGE, storage_path=str(run_dir), failure_config=FailureConfig(max_failures=0)))
    received: list[int] = []

    def handle(signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if received:
            print(f"received {name} again: stopping the Ray job now", file=sys.stderr, flush=True)
            raise KeyboardInterrupt
        received.append(signum)
        print(f"received {name}: the workers finish the iteration, then write last.ckpt (send {name} again "
              f"to stop at once)", file=sys.stderr, flush=True)
        stop.set.remote(signum)

    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # raised again in the main thread
            outcome["error"] = e

    # Ray's fit() waits in a thread: the main thread keeps this command's signal handlers (Ray's own
    # SIGINT handler, set only from the main thread, would end the workers without a checkpoint).
    previous = {signum: signal.signal(signum, handle) for signum in SIGNALS}
    try:
        waiting = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
        waiting.start()
        while waiting.is_alive():
            waiting.join(0.2)
    except KeyboardInterrupt:  # the second signal
        return 128 + received[0]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    error = outcome.get("error")
    if isinstance(error, TrainingFailedError):
        return _report_failure(error, run_dir)
    if error is not None:
        raise error
    if not received:
        return 0
    ending = ray.get(stop.ending.remote())
    if ending:
        print(ending, file=sys.stderr, flush=True)
    return 128 + received[0]


def _report_failure(error: Exception, run_dir: Path) -> int:
    """One line for a failed job, its full report in ``<run dir>/error.log``; exit code 1."""
    failures = getattr(error, "worker_failures", None) or {}
    rank, cause = min(failures.items()) if failures else (None, error)
    lines = [line for line in str(cause).splitlines() if line.strip()]
    # A worker's error arrives as its traceback: the last line is the exception itself.
    reason = lines[-1] if lines else type(cause).__name__
    with open(run_dir / "error.log", "a", encoding="utf-8") as log:
        log.write(f"{error}\n")
    where = f"rank {rank}" if rank is not None else "Ray Train"
    print(f"error: the Ray job failed on {where}: {reason} (details in {run_dir / 'error.log'})",
          file=sys.stderr, flush=True)
    return 1


class StopRequest:
    """A Ray actor holding the stop signal the driver received, read by every worker, and the line rank 0
    ends a stopped fit with, read by the driver."""

    def __init__(self):
        self.signum: int | None = None
        self.message: str | None = None

    def set(self, signum: int) -> None:
        self.signum = self.signum or signum

    def get(self) -> int | None:
        return self.signum

    def report(self, message: str | None) -> None:
        self.message = message

    def ending(self) -> str | None:
        return self.message

"""End every run with ``last.ckpt`` holding its last completed iteration, also on SIGTERM / SIGINT / SIGUSR1.

A scheduler's preemption (Slurm, Kubernetes, ``docker stop``) sends SIGTERM and waits a grace period
before SIGKILL; Ctrl-C sends SIGINT. The first signal lets the current iteration finish (update and
weight push), then training stops, ``last.ckpt`` is written and the CLI exits with 128 + the signal
number (143, 130) and marks the MLflow run KILLED. SIGUSR1, Slurm's warning before a job's time limit
(``--signal=USR1@90``, see lit_ppo.schedulers.slurm), stops the same way with 138, on which the batch
script requeues the job. A second signal while the iteration is still
generating abandons it at once; ``last.ckpt`` then holds the iteration before it, with the prompt
stream where that iteration left it, so a resume replays exactly. A second signal during the update
waits for the update (seconds), so that half-updated weights are never saved.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_received: list[int] = []  # signals are per process, and so is the record of one


def received_signal() -> int | None:
    """The first stop signal received during this process's latest fit, or None."""
    return _received[0] if _received else None


def request_stop(signum: int) -> None:
    """Stop this process's fit at the next iteration boundary as if it had received ``signum``: for a fit
    whose signals reach another process (a Ray Train worker's, whose driver relays them)."""
    if not _received:
        _received.append(signum)


def mark_runs_killed(trainer: L.Trainer) -> None:
    """Mark the trainer's MLflow runs KILLED (Lightning finalizes them as FINISHED or FAILED)."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        run_id = getattr(logger, "run_id", None)
        if run_id and hasattr(logger.experiment, "set_terminated"):
            logger.experiment.set_terminated(run_id, "KILLED")


class GracefulStop(L.Callback):
    """Stops at an iteration boundary on SIGTERM / SIGINT / SIGUSR1 and writes ``last.ckpt`` when training ends.

    Lightning's ModelCheckpoint writes ``last.ckpt`` only beside its periodic checkpoints, so a run
    that ends between two of them (at ``max_steps`` or on a signal) would leave a stale one; this
    callback writes it for the final iteration. Added by LitPPO itself.
    """

    def __init__(self):
        self._previous: dict[int, object] = {}
        self._trainer: L.Trainer | None = None
        self._saved_step = -1

    # ------------------------------------------------------------------ signals
    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self._trainer = trainer
        _received.clear()  # a signal stops the fit it arrived in, not a later one in this process
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; see request_stop
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        trainer = self._trainer
        generating = bool(getattr(trainer.datamodule, "collecting", False))
        if not _received:
            _received.append(signum)
            self._say(f"received {name}: finishing iteration {trainer.global_step + 1}, then writing last.ckpt "
                      f"(send {name} again to abandon the iteration)")
        elif generating:
            self._say(f"received {name} again: abandoning iteration {trainer.global_step + 1}")
            raise KeyboardInterrupt
        else:
            self._say(f"received {name} again: the update of iteration {trainer.global_step + 1} finishes first")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        # A signal may reach one rank only (kill <pid>): every rank stops at the same boundary.
        if trainer.strategy.reduce_boolean_decision(bool(_received), all=False):
            trainer.should_stop = True

    def teardown(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    # ------------------------------------------------------------------ last.ckpt
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        self._saved_step = trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.global_step > self._saved_step and (_received or self._keeps_last(trainer)):
            self._write_last(trainer)
        if _received:
            self._say(f"stopped by {signal.Signals(_received[0]).name} after iteration {trainer.global_step}; "
                      f"resume with --ckpt_path {self._last_path(trainer)}")

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        # Abandoned while generating: the weights are those of the last completed iteration and the
        # prompt stream reports the position where that iteration ended. Ranks would have to meet in
        # the checkpoint's barrier after an abandon, which they cannot be relied on to do.
        abandoned = isinstance(exception, KeyboardInterrupt) and _received
        if (abandoned and getattr(trainer.datamodule, "collecting", False) and trainer.world_size == 1
                and trainer.global_step > self._saved_step):
            self._write_last(trainer)
            self._say(f"last.ckpt holds iteration {trainer.global_step}; resume with --ckpt_path "
                      f"{self._last_path(trainer)}")

    @staticmethod
    def _keeps_last(trainer: L.Trainer) -> bool:
        return any(isinstance(cb, ModelCheckpoint) and cb.save_last for cb in trainer.callbacks)

    @staticmethod
    def _last_path(trainer: L.Trainer) -> Path:
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath:
                return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"

    def _write_last(self, trainer: L.Trainer) -> None:
        path = self._last_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # the full state: resuming needs it
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath and Path(cb.dirpath) == path.parent:
                cb.last_model_path = str(path)

    def _say(self, message: str) -> None:
        if self._trainer is None or self._trainer.is_global_zero:
            print(message, file=sys.stderr, flush=True)

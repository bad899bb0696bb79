"""End every run with ``last.ckpt`` holding its last completed iteration: at the end, on SIGTERM / SIGINT /
SIGUSR1, and when the run fails between iterations.

A scheduler's preemption (Slurm, Kubernetes, ``docker stop``) sends SIGTERM and waits a grace period
before SIGKILL; Ctrl-C sends SIGINT. The first signal lets the current iteration finish (update and
weight push), then training stops, ``last.ckpt`` is written and the CLI exits with 128 + the signal
number (143, 130) and marks the MLflow run KILLED. SIGUSR1, Slurm's warning before a job's time limit
(``--signal=USR1@90``, see lit_ppo.schedulers.slurm), stops the same way with 138, on which the batch
script requeues the job. A second signal while the iteration is still
generating abandons it at once; ``last.ckpt`` then holds the iteration before it, with the prompt
stream where that iteration left it, so a resume replays exactly. A second signal during the update
waits for the update (seconds), so that half-updated weights are never saved. A signal during an
evaluation between iterations (``trainer.val_check_interval``) ends it after the problem batch being
scored, unlogged (a part of the test split is no score), and stops with no iteration after it; a second
one abandons that batch. A signal after an iteration's end and before the next one starts is announced
by what comes next: the evaluation it skips, or the iteration it lets finish. A failure recorded with
``lit_ppo.utils.stop_requests.fail_after_iteration`` stops at the boundary the same way.

``last.ckpt`` of the final iteration is written before the final evaluation, so an evaluation that
fails loses no training; an error raised while a batch is generated or scored (a reward function that
raises or exits, a filter that starves the batch) writes ``last.ckpt`` of the iteration before it.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_ppo.rollout.source import RolloutSource
from lit_ppo.utils.stop_requests import (
    SIGNALS,
    forget_stop_requests,
    received_signal,
    record_signal,
    signal_name,
    stop_requested,
)


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
        self._last_before: tuple | None = None
        self._iteration: int | None = None  # the iteration running, until its end decides whether to stop
        self._unannounced: str | None = None  # a signal received between iterations, told by what follows

    # ------------------------------------------------------------------ signals
    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self._trainer = trainer
        forget_stop_requests()  # a request stops the fit it arrived in, not a later one in this process
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; see record_signal
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        name = signal_name(signum)
        trainer = self._trainer
        rollouts = trainer.datamodule  # a RolloutSource under LitPPO (checked at its fit start); sft's examples are not
        generating = isinstance(rollouts, RolloutSource) and rollouts.collecting
        evaluating = trainer.validating and not trainer.sanity_checking
        if received_signal() is None:
            record_signal(signum)
            if evaluating:
                self._say(f"received {name}: ending the evaluation of iteration {trainer.global_step} unscored, "
                          f"then writing last.ckpt (send {name} again to abandon the batch being scored)")
            elif self._iteration is not None:
                self._say(f"received {name}: finishing iteration {self._iteration}, then writing last.ckpt "
                          f"(send {name} again to abandon the iteration)")
            else:  # between iterations: an evaluation may come first or not, which its hooks know
                self._unannounced = name
        elif evaluating:
            self._say(f"received {name} again: abandoning the evaluation of iteration {trainer.global_step}")
            raise KeyboardInterrupt
        elif generating:
            self._say(f"received {name} again: abandoning iteration {trainer.global_step + 1}")
            raise KeyboardInterrupt
        elif self._iteration is not None:
            self._say(f"received {name} again: the update of iteration {self._iteration} finishes first")
        else:
            self._say(f"received {name} again: between iterations, nothing to abandon yet")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self._iteration = trainer.global_step + 1
        self._announce(f"finishing iteration {self._iteration}, then writing last.ckpt")

    def on_validation_start(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._announce(f"skipping the evaluation of iteration {trainer.global_step}, then writing last.ckpt")

    def _announce(self, what: str) -> None:
        if self._unannounced:
            self._say(f"received {self._unannounced}: {what}")
            self._unannounced = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        # A signal may reach one rank only (kill <pid>): every rank stops at the same boundary.
        self._iteration = None  # first: a signal from here on is announced by what follows
        stopping = trainer.strategy.reduce_boolean_decision(stop_requested(), all=False)
        if stopping:
            trainer.should_stop = True
        finished = 0 < trainer.max_steps <= trainer.global_step and self._keeps_last(trainer)
        if (stopping or finished) and trainer.global_step > self._saved_step and not _writes_last_now(trainer):
            # Before the final evaluation, which may fail (a reward that breaks on the test split).
            self._write_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        # A stop requested during an evaluation between iterations takes effect here, before the next
        # iteration (and the evaluation that a stop brings) would run; every rank decides together.
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        if trainer.strategy.reduce_boolean_decision(stop_requested(), all=False):
            trainer.should_stop = True
            if trainer.global_step > self._saved_step:
                self._write_last(trainer)

    def teardown(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    # ------------------------------------------------------------------ last.ckpt
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        # Lightning calls this before the file is written: the step is saved (on every rank, so that
        # none writes it again alone), but last.ckpt holds it only once the file has been replaced,
        # which a refused write (a full disk) never does.
        self._saved_step = trainer.global_step
        self._last_before = _file_identity(last_checkpoint_path(trainer))

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        # ModelCheckpoint keeps its state (last.ckpt's path, the periodic checkpoints it counts) under a key that
        # names its every_n_train_steps: a resume that changes checkpoint.every_n_iterations would find none, write
        # last.ckpt anew as last-v1.ckpt (which --ckpt_path last passes over) and never delete the run's older
        # checkpoints; one that lowers checkpoint.keep would count more checkpoints than it keeps, and fail. The
        # state of the run's callback of the same directory goes on, fitted to this one's save_top_k.
        states = checkpoint.get("callbacks") or {}
        for cb in trainer.callbacks:
            if isinstance(cb, ModelCheckpoint):
                state = states.get(cb.state_key) or _saved_state(cb, states)
                if state is not None:
                    states[cb.state_key] = _fitted_state(cb, state)

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.global_step > self._saved_step and (stop_requested() or self._keeps_last(trainer)):
            self._write_last(trainer)
        message = stop_message(trainer)
        if message:
            self._say(message)

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        if trainer.state.fn != "fit":
            return
        if trainer.global_step == 0:
            if isinstance(exception, KeyboardInterrupt) and received_signal() is not None:  # a second signal
                self._say(f"stopped by {signal_name(received_signal())} before the first iteration completed: "
                          f"nothing was trained")
            return
        # Stopped while a batch was generated or scored, or during an evaluation (a second signal, a
        # reward function that raised or exited): the weights are those of the last completed iteration
        # and the prompt stream reports the position where that iteration ended, so last.ckpt can hold it.
        # Ranks would have to meet in the checkpoint's barrier, which they cannot be relied on to do after
        # one of them failed.
        # A resumed fit has global_step > 0 before LitPPO.on_fit_start, which may refuse its datamodule (or none).
        rollouts = trainer.datamodule
        between = (isinstance(rollouts, RolloutSource) and rollouts.collecting) or trainer.validating
        if between and trainer.world_size == 1 and trainer.global_step > self._saved_step:
            self._write_last(trainer)
        path = last_checkpoint_path(trainer)
        if self._saved_step == trainer.global_step and _file_identity(path) not in (None, self._last_before):
            finished = 0 < trainer.max_steps <= trainer.global_step
            self._say(f"last.ckpt holds iteration {trainer.global_step}" +
                      (f" (training finished: export it with python -m lit_ppo export --ckpt_path {path} --output DIR)"
                       if finished else f"; resume with --ckpt_path {path}"))

    @staticmethod
    def _keeps_last(trainer: L.Trainer) -> bool:
        return any(isinstance(cb, ModelCheckpoint) and cb.save_last for cb in trainer.callbacks)

    def _write_last(self, trainer: L.Trainer) -> None:
        path = last_checkpoint_path(trainer)
        owners = _owners_of_last(trainer)
        for cb in owners:  # its state in the file names the file: a resume writes last.ckpt again, not last-v1.ckpt
            cb.last_model_path = str(path)
        trainer.save_checkpoint(path, weights_only=False)  # the full state: resuming needs it
        self._saved_step = trainer.global_step
        for cb in owners:
            # ModelCheckpoint writes last.ckpt when training ends unless it wrote one itself in this fit: the
            # same state again (3.2 GB for SmolLM2 under PPO).
            cb._last_checkpoint_saved = str(path)

    def _say(self, message: str) -> None:
        if self._trainer is None or self._trainer.is_global_zero:
            print(message, file=sys.stderr, flush=True)


def _owners_of_last(trainer: L.Trainer) -> list[ModelCheckpoint]:
    """The ModelCheckpoint callbacks whose directory holds last.ckpt."""
    directory = last_checkpoint_path(trainer).parent
    return [cb for cb in trainer.callbacks
            if isinstance(cb, ModelCheckpoint) and cb.dirpath and Path(cb.dirpath) == directory]


def _writes_last_now(trainer: L.Trainer) -> bool:
    """Whether the ModelCheckpoint of last.ckpt writes it at this iteration's end, beside its periodic checkpoint
    (it runs after every other callback): then that file holds the iteration, written once."""
    return any(cb.save_last and cb._every_n_train_steps >= 1 and trainer.global_step % cb._every_n_train_steps == 0
               and not cb._should_skip_saving_checkpoint(trainer) for cb in _owners_of_last(trainer))


def _saved_state(cb: ModelCheckpoint, states: dict) -> dict | None:
    """The state that the one ModelCheckpoint of ``cb``'s directory and monitor saved in a checkpoint's callback
    ``states`` under another key (other arguments); None if there is not exactly one."""
    saved = [state for key, state in states.items() if str(key).startswith(type(cb).__qualname__ + "{")
             and isinstance(state, dict) and state.get("dirpath") == cb.dirpath and state.get("monitor") == cb.monitor]
    return saved[0] if len(saved) == 1 else None


def _fitted_state(cb: ModelCheckpoint, state: dict) -> dict:
    """A ModelCheckpoint's saved ``state`` as ``cb`` keeps checkpoints: of the periodic checkpoints it counts,
    the best ``save_top_k`` (the newest, ranked by iteration), the worst of them the next to go once it holds
    that many (the others stay on disk until retention deletes every older one with it)."""
    best = state.get("best_k_models") or {}
    if cb.save_top_k < 0 or len(best) < cb.save_top_k:
        return state
    ranked = sorted(best.items(), key=lambda item: item[1], reverse=cb.mode == "max")[:cb.save_top_k]
    if not ranked:
        return {**state, "best_k_models": {}}
    kth_path, kth_value = ranked[-1]
    return {**state, "best_k_models": dict(ranked), "kth_best_model_path": kth_path, "kth_value": kth_value}


def last_checkpoint_path(trainer: L.Trainer) -> Path:
    """Where ``last.ckpt`` of ``trainer``'s run is: beside its ModelCheckpoint's files."""
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"


def stop_message(trainer: L.Trainer) -> str | None:
    """The line that ends a fit stopped early (by a signal or a recorded failure), or None."""
    where = f"after iteration {trainer.global_step}; resume with --ckpt_path {last_checkpoint_path(trainer)}"
    if received_signal() is not None:
        return f"stopped by {signal_name(received_signal())} {where}"
    return f"stopped {where}" if stop_requested() else None


def _file_identity(path: Path) -> tuple | None:
    """What tells one file at ``path`` from the next: checkpoints are written to a new file renamed onto
    the path (lit_ppo.training.checkpoint_io), so a completed write changes it and a refused one does not."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns

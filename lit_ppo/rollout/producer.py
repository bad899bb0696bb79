"""Asynchronous rollouts (``rollout.max_head_offpolicyness = k > 0``): a producer thread generates
batches ahead of the trainer while it trains, at most k policy versions ahead.

The bound: the producer starts a batch only while at most k batches are outstanding (generated and
not yet trained on, the one in training included). Each of them advances the policy by at most one
version before the new batch is trained, so none of its tokens is more than k versions older than
the policy that trains on it. The hand-over checks the bound again (``drop_stale``): a group older
than it is never trained on, whatever produced it (a checkpoint's queue resumed with a smaller k).

The engine is shared by two threads (``SharedEngine``): the producer samples, the trainer pushes
weights after every update and evaluates. A push leaves a snapshot of the new weights, which the
engine loads before its next ``generate`` call, under the lock that every call holds: weights never
change during a call, and each completion carries the version that sampled it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import fields
from typing import Callable, Iterable

import torch

from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import Completion, RolloutEngine, SamplingParams


class SharedEngine:
    """A rollout engine used by the producer thread and the trainer at once (implements ``RolloutEngine``).

    ``update_weights`` (trainer) copies the weights into a pending snapshot and returns at once;
    ``generate`` (either thread) loads the newest snapshot first, then samples, holding the engine's
    lock throughout. ``sleep`` / ``wake`` do nothing: generation runs during the update.
    """

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self._lock = threading.Lock()
        """Held by every generate call and every load of a snapshot."""
        self._pending: tuple[int, list[tuple[str, torch.Tensor]]] | None = None
        self._pending_lock = threading.Lock()

    @property
    def version(self) -> int:
        """The version the next ``generate`` samples with (the newest pushed)."""
        with self._pending_lock:
            return self.engine.version if self._pending is None else self._pending[0]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        with self._lock:
            with self._pending_lock:
                pending, self._pending = self._pending, None
            if pending is not None:
                version, weights = pending
                self.engine.update_weights(weights, version=version)
            return self.engine.generate(prompts, params)

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        snapshot = [(name, tensor.detach().clone()) for name, tensor in weights]
        with self._pending_lock:
            self._pending = (version, snapshot)  # an older snapshot not yet loaded is never needed

    def sleep(self) -> None:
        """No-op: the producer generates while the trainer updates."""

    def wake(self) -> None:
        """No-op (see ``sleep``)."""


def drop_stale(batch: RolloutBatch, version: int, max_head_offpolicyness: int) -> tuple[RolloutBatch, int]:
    """``batch`` without the groups holding a token sampled more than ``max_head_offpolicyness``
    versions before ``version``, and how many groups were dropped."""
    if batch.num_rows == 0:
        return batch, 0
    generated = batch.versions.masked_fill(~batch.loss_mask.bool(), version)
    oldest = generated.min(1).values  # [B]: each row's oldest generated token
    keep, start = [], 0
    for g, size in enumerate(batch.group_sizes.tolist()):
        if version - int(oldest[start:start + size].min()) <= max_head_offpolicyness:
            keep.append(g)
        start += size
    dropped = batch.num_groups - len(keep)
    if not dropped:
        return batch, 0
    kept = batch.select_groups(keep)
    kept.metrics = batch.metrics
    return kept, dropped


def batch_to_dict(batch: RolloutBatch) -> dict:
    """A batch as plain tensors, lists and numbers (checkpoints load with ``weights_only=True``)."""
    return {f.name: getattr(batch, f.name) for f in fields(batch)}


class AsyncProducer:
    """Generates batches on its own thread, ahead of the trainer by at most ``max_head_offpolicyness``.

    Args:
        collect: generates, scores and filters one batch (runs on the producer thread only).
        position: the prompt-stream position after the batch ``collect`` returned last (read on the
            producer thread, right after each batch).
        max_head_offpolicyness: k, the most batches outstanding when a new one starts.
        num_threads: torch CPU threads of the producer thread.
        remaining_iterations: how many more batches the trainer will train on (None: no end), read
            before each batch: no batch is generated that nothing would train on.
        queued: batches generated earlier and not trained on yet (a checkpoint's), handed over first.
    """

    def __init__(self, collect: Callable[[], RolloutBatch], position: Callable[[], dict], max_head_offpolicyness: int,
                 num_threads: int, remaining_iterations: Callable[[], int | None],
                 queued: list[RolloutBatch] | None = None):
        self._collect = collect
        self._position = position
        self.max_head_offpolicyness = max_head_offpolicyness
        self.num_threads = num_threads
        self._remaining = remaining_iterations
        self._queue: deque[RolloutBatch] = deque(queued or [])
        self._boundary = position()
        """The stream position after the last queued batch: a checkpoint's, with the queue."""
        self._training = False
        """A batch was handed over and its iteration has not ended yet."""
        self._generating = False
        """A batch is being generated (it joins the queue even if the producer is closed meanwhile)."""
        self._error: BaseException | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="lit_ppo-rollout-producer", daemon=True)

    # ------------------------------------------------------------------ producer thread
    def start(self) -> None:
        self._thread.start()

    def _outstanding(self) -> int:
        return len(self._queue) + self._training

    def _may_start(self) -> bool:
        remaining = self._remaining()
        return self._outstanding() <= self.max_head_offpolicyness and (remaining is None
                                                                      or self._outstanding() < remaining)

    def _run(self) -> None:
        # A thread takes the process-wide count at its first torch call; make that call first, so the
        # count set next is this thread's own and later calls on other threads do not change it.
        torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._closed or self._may_start())
                    if self._closed:
                        return
                    self._generating = True
                batch = self._collect()
                with self._changed:
                    self._queue.append(batch)
                    self._boundary = self._position()
                    self._generating = False
                    self._changed.notify_all()
        except BaseException as error:  # re-raised on the trainer's thread by take()
            with self._changed:
                self._error = error
                self._generating = False
                self._changed.notify_all()

    # ------------------------------------------------------------------ trainer thread
    def take(self) -> tuple[RolloutBatch, float, int]:
        """The next batch (waiting for it if none is ready), the seconds waited, and how many batches
        are still queued. Raises whatever stopped the producer once the queue is empty."""
        start = time.perf_counter()
        with self._changed:
            # A timed wait: a signal handler (GracefulStop's) can interrupt it.
            while not self._queue and self._error is None:
                self._changed.wait(timeout=1.0)
            if not self._queue:
                raise self._error
            batch = self._queue.popleft()
            self._training = True
            self._changed.notify_all()
            return batch, time.perf_counter() - start, len(self._queue)

    def iteration_done(self) -> None:
        """The batch taken last has been trained on (or skipped), and its weights pushed."""
        with self._changed:
            self._training = False
            self._changed.notify_all()

    def state(self, finish_batch: bool = True) -> tuple[dict, list[RolloutBatch]]:
        """The stream position after the queued batches, and the queued batches (not the one in
        training). ``finish_batch``: first wait for the batch being generated, which then counts as
        queued: it was sampled by the weights it started with, which a resume no longer has."""
        with self._changed:
            while finish_batch and self._generating:
                self._changed.wait(timeout=1.0)
            return dict(self._boundary), list(self._queue)

    def close(self, wait: bool = True) -> None:
        """Stop the producer. ``wait``: until the batch in progress has joined the queue; else the
        thread ends on its own after it."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if wait and self._thread.is_alive():
            self._thread.join()

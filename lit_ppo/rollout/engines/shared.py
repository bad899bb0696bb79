"""One engine's ``generate`` shared by many threads, batching what waits: while the engine samples one
call, the requests that arrive queue up, and the next call samples all of them that share its sampling
parameters at once (the engine batches prompts far better than it runs them one by one). Agents' episodes,
each a thread or a task calling its own client, reach the engine through it.

A batched call samples with the seed of its first request: which requests share a call depends on timing,
so episodes that run at once are reproducible as a whole only where they run one at a time.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, replace

from lit_ppo.rollout.engines.protocol import Completion, RolloutEngine, SamplingParams


@dataclass
class _Request:
    prompts: list[list[int]]
    params: SamplingParams
    done: Future


class SharedGenerate:
    """``generate(prompts, params)`` on ``engine`` from any thread, batched (see the module docstring).

    Args:
        engine: the rollout engine.
        max_prompts: the most prompts one engine call samples.
    """

    def __init__(self, engine: RolloutEngine, max_prompts: int = 256):
        self.engine = engine
        self.max_prompts = max_prompts
        self._waiting: list[_Request] = []
        self._lock = threading.Lock()
        self._sampling = False
        self.calls = 0
        """Engine calls made so far."""

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """The engine's completions of ``prompts``, sampled in a call with whatever else waits."""
        request = _Request([list(p) for p in prompts], params, Future())
        with self._lock:
            self._waiting.append(request)
            lead = not self._sampling
            self._sampling = True
        if lead:  # no call runs: this thread samples, for every request that waits, until none does
            self._serve()
        return request.done.result()

    def _serve(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._waiting:
                        self._sampling = False
                        return
                    batch = self._batch()
                self._sample(batch)
        except BaseException as e:  # the serving thread is interrupted: no request is left waiting for it
            with self._lock:
                self._sampling = False
                waiting, self._waiting = self._waiting, []
            for request in waiting:
                request.done.set_exception(e)
            raise

    def _batch(self) -> list[_Request]:
        """The first waiting request and those after it with the same parameters (but the seed), within
        ``max_prompts``; taken off the queue."""
        first = self._waiting[0]
        key = replace(first.params, seed=None)
        batch, count = [], 0
        for request in list(self._waiting):
            if replace(request.params, seed=None) == key and (not batch or count + len(request.prompts)
                                                                <= self.max_prompts):
                batch.append(request)
                count += len(request.prompts)
                self._waiting.remove(request)
        return batch

    def _sample(self, batch: list[_Request]) -> None:
        prompts = [p for request in batch for p in request.prompts]
        try:
            self.calls += 1
            out = self.engine.generate(prompts, batch[0].params)
            if len(out) != len(prompts):
                raise ValueError(f"engine returned completions for {len(out)} prompts, expected {len(prompts)}")
        except BaseException as e:  # every request of the call hears it
            for request in batch:
                request.done.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        start = 0
        for request in batch:
            request.done.set_result(out[start:start + len(request.prompts)])
            start += len(request.prompts)

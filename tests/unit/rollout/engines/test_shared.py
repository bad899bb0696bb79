"""One engine shared by many threads (lit_ppo.rollout.engines.shared): what waits while the engine samples
goes in its next call, each caller gets its own completions, parameters are never mixed, errors reach
every caller of the failed call."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.engines.shared import SharedGenerate


class ReversingEngine:
    """Completes a prompt with its tokens reversed (max_new_tokens of them, n times); records each call's
    prompts; the first call waits for ``release`` when given."""

    version = 3

    def __init__(self, release: threading.Event | None = None, fail: bool = False):
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.release, self.fail = release, fail
        self.started = threading.Event()

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        self.started.set()
        if self.release is not None and len(self.calls) == 1:
            assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("the engine is gone")
        return [[Completion(p[::-1][:params.max_new_tokens], [-1.0] * min(len(p), params.max_new_tokens), True,
                            self.version)] * params.n for p in prompts]


def test_what_waits_while_the_engine_samples_goes_in_its_next_call():
    release = threading.Event()
    engine = ReversingEngine(release)
    shared = SharedGenerate(engine)
    params = SamplingParams(max_new_tokens=8)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(shared.generate, [[1, 2]], params)
        assert engine.started.wait(10)
        rest = [pool.submit(shared.generate, [[i, i + 1, i + 2]], SamplingParams(max_new_tokens=8, seed=i))
                for i in range(10, 17)]
        time.sleep(0.2)  # all seven wait behind the first call
        release.set()
        assert first.result()[0][0].token_ids == [2, 1]
        for i, future in zip(range(10, 17), rest):
            ((completion,),) = future.result()
            assert completion.token_ids == [i + 2, i + 1, i] and completion.version == 3
    assert [len(prompts) for prompts, _ in engine.calls] == [1, 7]
    assert engine.calls[1][1].seed == 10 and shared.calls == 2  # the batched call has its first request's seed


def test_requests_of_other_parameters_or_beyond_the_limit_wait_for_a_call_of_their_own():
    release = threading.Event()
    engine = ReversingEngine(release)
    shared = SharedGenerate(engine, max_prompts=3)
    with ThreadPoolExecutor(8) as pool:
        pool.submit(shared.generate, [[1]], SamplingParams())
        assert engine.started.wait(10)
        short = [pool.submit(shared.generate, [[i]], SamplingParams(max_new_tokens=2)) for i in range(4)]
        long = pool.submit(shared.generate, [[9, 9]], SamplingParams(max_new_tokens=5, n=2))
        time.sleep(0.2)
        release.set()
        assert len(long.result()[0]) == 2 and all(len(f.result()) == 1 for f in short)
    sizes = [(len(prompts), params.max_new_tokens) for prompts, params in engine.calls]
    assert sizes == [(1, 64), (3, 2), (1, 2), (1, 5)]  # in arrival order, never mixed


def test_an_engine_error_reaches_every_caller_of_the_call():
    shared = SharedGenerate(ReversingEngine(fail=True))
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(shared.generate, [[i]], SamplingParams()) for i in range(4)]
        for future in futures:
            with pytest.raises(RuntimeError, match="the engine is gone"):
                future.result()
    shared.engine.fail = False  # a later call is served
    assert shared.generate([[5, 6]], SamplingParams())[0][0].token_ids == [6, 5]

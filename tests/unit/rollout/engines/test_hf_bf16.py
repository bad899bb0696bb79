"""The HF engine in bfloat16 (``rollout.engine_kwargs.dtype`` / ``autocast``; ``lit_ppo.rollout.engines.hf``),
on CPU without downloads: an autocast engine samples in bfloat16 on any thread and casts each weight once per
generate call, a bfloat16 engine holds bfloat16 weights and casts the weights pushed to it. The gaps to the
trainer's recompute are measured values with margin (``tests.unit.logprob_gap``)."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lit_ppo.models import build_tiny
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import SamplingParams
from tests.unit.logprob_gap import gap


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = build_tiny(cache_dir=tmp_path_factory.mktemp("cache"))
    return model.eval(), tok


PARAMS = SamplingParams(n=8, max_new_tokens=8, temperature=1.0, seed=0)


def test_an_autocast_engine_samples_in_bfloat16_on_any_thread(tiny):
    """autocast='bfloat16' (what the data module passes under bf16-mixed) holds on a thread without the
    trainer's autocast too, as the asynchronous producer's: before, that thread sampled in float32 and
    the gap check stopped an asynchronous bf16-mixed run at its first iteration. The check compares the
    engine with itself: how far its incremental bfloat16 decoding lands from the trainer's bfloat16
    forward pass depends on the CPU's kernels (1e-7 on one with AMX, 2.5e-3 on one without)."""
    model, tok = tiny
    prompts = [tok.encode("12+7="), tok.encode("3+4=")]
    engine = HFEngine(model, tok, autocast="bfloat16")
    results = {}
    thread = threading.Thread(target=lambda: results.update(out=engine.generate(prompts, PARAMS)))
    thread.start()
    thread.join()
    on_main = engine.generate(prompts, PARAMS)  # the same seed: the same samples, computed the same way
    assert [[c.token_ids for c in cs] for cs in results["out"]] == [[c.token_ids for c in cs] for cs in on_main]
    assert [[c.logprobs for c in cs] for cs in results["out"]] == [[c.logprobs for c in cs] for cs in on_main]
    assert gap(model, prompts, results["out"], bf16=False) > 1e-3  # not float32 (which agrees to 1e-7)
    # Without it, that thread computes in float32: exactly what the float32 trainer computes.
    plain = HFEngine(model, tok).generate(prompts, PARAMS)
    assert gap(model, prompts, plain, bf16=False) < 1e-5
    assert gap(model, prompts, plain, bf16=True) > 1e-3  # measured 5.6e-3


class _WeightCasts(TorchDispatchMode):
    """Counts casts of float32 tensors of ``shape`` to bfloat16."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Autocast casts through aten.to.dtype in inference mode and aten._to_copy outside it.
        if func is torch.ops.aten._to_copy.default:
            dtype = kwargs.get("dtype")
        elif func is torch.ops.aten.to.dtype:
            dtype = args[1]
        else:
            dtype = None
        if dtype == torch.bfloat16 and tuple(args[0].shape) == self.shape and args[0].dtype == torch.float32:
            self.count += 1
        return func(*args, **kwargs)


def test_an_autocast_engine_casts_each_weight_once_per_call_and_sees_every_update(tiny):
    """Decoding steps reuse one bfloat16 cast of each weight per generate call (before, every step
    cast every weight: 3x a SmolLM2 decode step's matmul time); the result equals a per-step cast's,
    and a weight update between calls reaches the next call."""
    model, tok = tiny
    prompts = [tok.encode("12+7="), tok.encode("3+4=")]
    params = SamplingParams(n=4, max_new_tokens=6, temperature=1.0, seed=3)
    engine = HFEngine(model, tok, autocast="bfloat16")
    weight = engine.model.model.layers[0].mlp.down_proj.weight
    with _WeightCasts(weight.shape) as casts:
        out = engine.generate(prompts, params)
    assert max(len(c.token_ids) for cs in out for c in cs) > 1  # several decoding steps ran
    assert casts.count == sum(p.shape == weight.shape for p in engine.model.parameters())  # one per layer
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        per_step = engine._generate(prompts, params)  # every step casts every weight
    assert [[(c.token_ids, c.logprobs) for c in cs] for cs in out] == \
        [[(c.token_ids, c.logprobs) for c in cs] for cs in per_step]
    # An update between calls: the next call equals a new engine built from the updated weights.
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.update_weights(changed.named_parameters(), version=1)
    fresh = HFEngine(changed, tok, autocast="bfloat16").generate(prompts, params)
    assert [[c.logprobs for c in cs] for cs in engine.generate(prompts, params)] == \
        [[c.logprobs for c in cs] for cs in fresh]
    assert [[c.logprobs for c in cs] for cs in fresh] != [[c.logprobs for c in cs] for cs in out]


def test_a_bfloat16_engine_holds_bfloat16_weights_and_casts_pushes(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok, dtype="bfloat16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the trainer's copy is untouched
    moved = {n: p.detach() + 0.01 for n, p in model.named_parameters()}
    engine.update_weights(moved.items(), version=1)
    for n, p in engine.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, moved[n].bfloat16()), n
    engine.update_weights(model.named_parameters(), version=2)
    prompts = [tok.encode("12+7=")]
    out = engine.generate(prompts, PARAMS)
    assert all(isinstance(lp, float) for c in out[0] for lp in c.logprobs)
    # Rounding of the weights and activations, not a wrong policy: of the order of 1e-3 to 1e-2.
    assert 1e-3 < gap(model, prompts, out, bf16=True) < 0.05  # measured 6e-3

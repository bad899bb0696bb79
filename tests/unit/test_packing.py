"""Unit tests for ``lit_ppo.models.packing``: first-fit-decreasing bins, the packed layout (position ids
restarting per row), and packed forwards equal to padded ones (hidden states, log-probs, critic
values and their gradients) on the tiny model and small random Llamas with sdpa and eager attention,
under LoRA and gradient checkpointing; no pad token is computed; bodies that do not honour packed
position ids keep the padded forward."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lit_ppo.models import packing
from lit_ppo.config import ModelConfig
from lit_ppo.models.lora import add_lora, lora_config
from lit_ppo.models import TinyModelConfig, build_critic, build_tiny, token_logprobs
from lit_ppo.models.loading import _hidden_states
from lit_ppo.models.packing import (first_fit_decreasing, packed_hidden_states, packing_supported, padded_hidden_states,
                             plan_packing)

T = 10
SPANS = ((0, 10), (2, 6), (4, 1), (0, 3), (5, 5), (1, 2), (3, 6))
"""(first real column, real length) of each row: a full row, left- and right-padded rows (prompt
left-padded, response right-padded), a single real token, right-padded only, left-padded only."""
BINS = [[0], [1, 3, 2], [6, 5], [4]]
"""``first_fit_decreasing`` of the lengths (10, 6, 1, 3, 5, 2, 6) into bins of 10."""


pytestmark = pytest.mark.usefixtures("one_torch_thread")

def adapters(rank: int, targets, dropout: float = 0.0):
    """peft's LoraConfig of rank ``rank`` on ``targets``, alpha 8."""
    return lora_config(ModelConfig(lora_rank=rank, lora_alpha=8.0, lora_dropout=dropout, lora_target_modules=targets))



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(TinyModelConfig(), tmp_path_factory.mktemp("cache"))[0]


def _llama(attn: str):
    """A random two-layer Llama with grouped-query attention and the given attention implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=1)
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    assert model.config._attn_implementation == attn
    return model


@pytest.fixture(params=["tiny", "llama-sdpa", "llama-eager"])
def model(request, tiny):
    return copy.deepcopy(tiny).train() if request.param == "tiny" else _llama(request.param[6:]).train()


def _batch(vocab: int, spans=SPANS, width: int = T, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(spans), width), generator=g)
    mask = torch.zeros(len(spans), width, dtype=torch.bool)
    for row, (start, length) in enumerate(spans):
        mask[row, start:start + length] = True
    return ids.masked_fill(~mask, 0), mask


@pytest.fixture
def padded_only(monkeypatch):
    """Every body runs padded: the reference the packed forwards must equal."""
    monkeypatch.setattr(packing, "packing_supported", lambda body, device=None: False)


def _input_shapes(body, fn) -> list[tuple[int, ...]]:
    """The ``input_ids`` shapes ``body`` receives while ``fn()`` runs without grad (a forward pre-hook)."""
    shapes = []
    handle = body.register_forward_pre_hook(lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                            with_kwargs=True)
    try:
        with torch.no_grad():
            fn()
    finally:
        handle.remove()
    return shapes


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _assert_grads_close(got: dict, expected: dict):
    assert got.keys() == expected.keys() and expected
    assert any(g.abs().sum() > 0 for g in expected.values())
    for name in expected:  # float32 rounding: within 1e-5 of each gradient's largest entry
        scale = float(expected[name].abs().max())
        assert _max_gap(got[name], expected[name]) <= 1e-5 * max(scale, 1e-3), name


def _max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


# --------------------------------------------------------------------------------------------
# bins and layout
# --------------------------------------------------------------------------------------------


def test_first_fit_decreasing_example():
    lengths = [length for _, length in SPANS]
    assert first_fit_decreasing(lengths) == BINS
    assert first_fit_decreasing(lengths, capacity=33) == [[0, 1, 6, 4, 3, 5, 2]]
    assert first_fit_decreasing([]) == [] and first_fit_decreasing([0, 0]) == []
    assert first_fit_decreasing([4]) == [[0]]
    with pytest.raises(ValueError, match="row 1 has length 5"):
        first_fit_decreasing([3, 5], capacity=4)


def test_first_fit_decreasing_properties():
    """Every row of length > 0 is in exactly one bin, no bin exceeds the capacity, rows of length 0
    are in none, and no two bins could be merged (first fit opens a bin only when none has room)."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        lengths = torch.randint(0, 40, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
        capacity = None if trial % 2 else max(lengths) + int(torch.randint(0, 20, (1,), generator=g))
        bins = first_fit_decreasing(lengths, capacity)
        cap = max(lengths) if capacity is None else capacity
        placed = sorted(row for b in bins for row in b)
        assert placed == [i for i, n in enumerate(lengths) if n > 0]
        loads = [sum(lengths[row] for row in b) for b in bins]
        assert all(0 < load <= cap for load in loads)
        assert all(loads[i] + loads[j] > cap for i in range(len(bins)) for j in range(i + 1, len(bins)))


def test_plan_packing_layout_restarts_positions_per_row():
    ids, mask = _batch(50)
    plan = plan_packing(mask)
    assert (plan.n_bins, plan.width) == (len(BINS), max(n for _, n in SPANS))
    packed, positions = plan.pack(ids)
    assert packed.shape == positions.shape == (len(BINS), plan.width)
    for b, rows in enumerate(BINS):
        expected_ids, expected_pos = [], []
        for row in rows:
            expected_ids += ids[row][mask[row]].tolist()
            expected_pos += list(range(int(mask[row].sum())))
        leftover = plan.width - len(expected_ids)
        assert packed[b].tolist() == expected_ids + [0] * leftover
        assert positions[b].tolist() == expected_pos + [0] * leftover  # restarting at 0 for each row
    # every real token exactly once, back in its place; padding comes back as 0
    back = plan.unpack(packed.unsqueeze(-1).float(), tuple(mask.shape)).squeeze(-1).long()
    assert torch.equal(back, ids * mask)
    # a row with a hole packs its real tokens side by side, positions counting real tokens
    hole = torch.tensor([[True, True, False, True]])
    packed, positions = plan_packing(hole).pack(torch.tensor([[5, 6, 7, 8]]))
    assert packed.tolist() == [[5, 6, 8]] and positions.tolist() == [[0, 1, 2]]


# --------------------------------------------------------------------------------------------
# packed forwards equal padded ones
# --------------------------------------------------------------------------------------------


def test_hidden_states_and_gradients_packed_equal_padded(model):
    body = model.base_model
    assert packing_supported(body)
    ids, mask = _batch(model.config.vocab_size)
    weights = torch.randn(*mask.shape, body.config.hidden_size, generator=torch.Generator().manual_seed(1))
    results = []
    for forward in (packed_hidden_states, padded_hidden_states):
        model.zero_grad(set_to_none=True)
        hidden = forward(body, ids, mask)
        assert hidden.shape == (*mask.shape, body.config.hidden_size)
        (hidden * weights)[mask].sum().backward()
        results.append((hidden.detach(), _grads(model)))
    (packed, packed_grads), (padded, padded_grads) = results
    assert _max_gap(packed[mask], padded[mask]) <= 1e-5
    assert (packed[~mask] == 0).all()
    _assert_grads_close(packed_grads, padded_grads)


def test_token_logprobs_and_critic_values_packed_equal_padded(model, monkeypatch):
    ids, mask = _batch(model.config.vocab_size)
    loss_mask = mask.clone()
    loss_mask[:, :3] = False
    assert packing_supported(model.base_model)
    critic = build_critic(model)
    torch.nn.init.normal_(critic.head.weight, std=1.0)
    results = []
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr(packing, "packing_supported", lambda body, device=None: False)
        model.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, ids, mask, temperature=0.8, loss_mask=loss_mask,
                                       chunk_size=7, with_entropy=True)
        (logp.sum() + entropy.sum()).backward()
        values, final = critic.values(ids, mask)
        (values.sum() + final.sum()).backward()
        with torch.no_grad():
            no_grad_logp, _ = token_logprobs(model, ids, mask, temperature=0.8, loss_mask=loss_mask)
            no_grad_values, _ = critic.values(ids, mask)
        results.append(([logp, entropy, values, final, no_grad_logp, no_grad_values], _grads(model), _grads(critic)))
    (packed_out, packed_policy, packed_critic), (padded_out, padded_policy, padded_critic) = results
    assert padded_out[0].abs().sum() > 0 and padded_out[2].abs().sum() > 0
    for name, got, expected in zip(("logp", "entropy", "values", "final", "no-grad logp", "no-grad values"),
                                   packed_out, padded_out):
        assert _max_gap(got, expected) <= 1e-5, name
    _assert_grads_close(packed_policy, padded_policy)
    _assert_grads_close(packed_critic, padded_critic)


def test_no_pad_token_is_computed(tiny):
    """The body receives the bins only: their total is the real tokens plus the bins' leftover."""
    ids, mask = _batch(tiny.config.vocab_size)
    body = tiny.base_model
    packing_supported(body)  # probed before the hook counts
    shapes = _input_shapes(body, lambda: token_logprobs(tiny, ids, mask))
    width = max(n for _, n in SPANS)
    assert shapes == [(len(BINS), width)]
    leftover = sum(width - sum(SPANS[row][1] for row in rows) for rows in BINS)
    assert len(BINS) * width == int(mask.sum()) + leftover < mask.numel()


@pytest.mark.parametrize("spans", [((2, 5),), ((0, 1),), ((3, 1), (0, 1), (9, 1)), ((0, 10),) * 3],
                         ids=["one-row", "one-token", "single-tokens", "no-padding"])
def test_edge_batches_packed_equal_padded(tiny, spans, padded_only, monkeypatch):
    ids, mask = _batch(tiny.config.vocab_size, spans)
    body = tiny.base_model
    expected = _hidden_states(body, ids, mask)
    monkeypatch.undo()
    outputs = []
    shapes = _input_shapes(body, lambda: outputs.append(_hidden_states(body, ids, mask)))
    got = outputs[0]
    lengths = [n for _, n in spans]
    assert shapes[-1] == (len(first_fit_decreasing(lengths)), max(lengths))
    assert _max_gap(got[mask], expected[mask]) <= 1e-5


def test_rows_without_real_tokens(tiny):
    ids, mask = _batch(tiny.config.vocab_size, ((0, 4), (0, 0), (2, 3)))
    body = tiny.base_model
    with torch.no_grad():
        packed, padded = packed_hidden_states(body, ids, mask), padded_hidden_states(body, ids, mask)
    assert (packed[1] == 0).all() and _max_gap(packed[mask], padded[mask]) <= 1e-5
    # nothing real at all: the body still runs once (every FSDP rank must), on the padded batch
    empty = torch.zeros_like(mask)
    shapes = _input_shapes(body, lambda: packed_hidden_states(body, ids, empty))
    assert shapes == [tuple(mask.shape)]


def test_lora_and_gradient_checkpointing_packed_equal_padded(tiny, monkeypatch):
    """LoRA adapters (peft injected into the plain model) and HF gradient checkpointing under packing:
    log-probs and gradients equal the padded forward without checkpointing."""
    ids, mask = _batch(tiny.config.vocab_size)
    results = []
    for packed in (True, False):
        model = add_lora(copy.deepcopy(tiny), adapters(4, "all-linear")).train()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for name, p in model.named_parameters():
                if ".lora_" in name:
                    p.normal_(0.0, 0.2)
        if packed:
            model.gradient_checkpointing_enable()
            assert packing_supported(model.base_model)
        else:
            monkeypatch.setattr(packing, "packing_supported", lambda body, device=None: False)
        logp, _ = token_logprobs(model, ids, mask, chunk_size=5)
        logp.sum().backward()
        grads = _grads(model)
        assert grads and all(".lora_" in name for name in grads)
        results.append((logp.detach(), grads))
    assert _max_gap(results[0][0], results[1][0]) <= 1e-5
    _assert_grads_close(results[0][1], results[1][1])


# --------------------------------------------------------------------------------------------
# the probe
# --------------------------------------------------------------------------------------------


def test_probe_runs_once_in_eval_mode_and_restores_modes(tiny):
    """With LoRA dropout the train-mode forward is random: the probe runs in eval mode, once per body
    and attention implementation, and leaves every module's mode as it found it."""
    model = add_lora(copy.deepcopy(tiny), adapters(4, "all-linear", dropout=0.5)).train()
    model.base_model.layers[0].eval()  # a mixed state, restored as it was
    modes = {name: m.training for name, m in model.named_modules()}
    results = []
    _input_shapes(model.base_model, lambda: results.append(packing_supported(model.base_model)))
    again = _input_shapes(model.base_model, lambda: results.append(packing_supported(model.base_model)))
    assert results == [True, True] and again == []  # cached: no second probe
    assert {name: m.training for name, m in model.named_modules()} == modes


def test_body_ignoring_packed_positions_keeps_the_padded_forward():
    """Bloom derives its ALiBi positions and mask from the attention mask, not from position ids:
    packed rows would see each other. The probe finds it and the padded forward runs."""
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=50, hidden_size=32, n_layer=1, n_head=2)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BloomForCausalLM(config).eval()
    ids, mask = _batch(50)
    body = model.base_model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not packing_supported(body)
    assert any("sequence packing is off for BloomModel" in str(w.message) for w in caught)
    outputs = []
    shapes = _input_shapes(body, lambda: outputs.append(_hidden_states(body, ids, mask)))
    got = outputs[0]
    assert shapes == [tuple(mask.shape)]
    with torch.no_grad():
        assert torch.equal(got, padded_hidden_states(body, ids, mask))
        # what packing would have computed is really different: the fallback is needed
        assert _max_gap(packed_hidden_states(body, ids, mask)[mask], got[mask]) > 1e-4

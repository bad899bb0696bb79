"""Unit tests for ``lit_ppo.models.packing``: first-fit-decreasing bins, the packed layout (position ids
restarting per row), and packed forwards equal to padded ones (hidden states, log-probs, critic
values and their gradients) on the tiny model and small random Llamas with sdpa and eager attention,
under LoRA and gradient checkpointing; no pad token is computed; bodies that do not honour packed
position ids keep the padded forward. The prefix tree: its layout and mask by hand, each shared
prefix computed once, forwards and gradients equal to padded ones, and eager attention (which
cannot take its mask) running packed rows instead."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lit_ppo.config import ModelConfig
from lit_ppo.models import TinyModelConfig, build_critic, build_tiny, packing, token_logprobs
from lit_ppo.models.logprobs import _hidden_states
from lit_ppo.models.lora import add_lora, lora_config
from lit_ppo.models.packing import (
    first_fit_decreasing,
    packed_hidden_states,
    packing_supported,
    padded_hidden_states,
    plan_packing,
    plan_prefix_tree,
    planned_hidden_states,
    prefix_tree_supported,
)

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
    packing_supported(body), prefix_tree_supported(body)  # probed before the hook counts
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


def _with_random_adapters(tiny):
    """A copy of ``tiny`` in train mode with rank-4 LoRA adapters on every linear layer, their weights
    drawn at random (fresh ones would leave B = 0 and the adapters without effect)."""
    model = add_lora(copy.deepcopy(tiny), adapters(4, "all-linear")).train()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0.0, 0.2)
    return model


def test_lora_and_gradient_checkpointing_packed_equal_padded(tiny, monkeypatch):
    """LoRA adapters (peft injected into the plain model) and HF gradient checkpointing under packing:
    log-probs and gradients equal the padded forward without checkpointing."""
    ids, mask = _batch(tiny.config.vocab_size)
    results = []
    for packed in (True, False):
        model = _with_random_adapters(tiny)
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


# --------------------------------------------------------------------------------------------
# the prefix tree
# --------------------------------------------------------------------------------------------

TREE_ROWS = ((5, 6, 7, 8), (5, 6, 9), (5, 6, 7, 8), (1, 2))
"""A group's shape in miniature: rows 0 and 2 identical, row 1 sharing their first two tokens, row
3 sharing nothing. Sorted: row 3, row 0, row 2, row 1."""
TREE_SLOTS = {3: [0, 1], 0: [2, 3, 4, 5], 2: [2, 3, 4, 5], 1: [2, 3, 6]}
"""Each row's slots in the one bin: row 2 reuses all of row 0's, row 1 the first two."""


def _tree_batch(rows, width: int, prompt_start: int = 2):
    """``rows`` as a padded ``[len(rows), width]`` batch whose real tokens start at ``prompt_start``
    (left padding) and end before right padding."""
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for r, row in enumerate(rows):
        ids[r, prompt_start:prompt_start + len(row)] = torch.tensor(row)
        mask[r, prompt_start:prompt_start + len(row)] = True
    return ids, mask


def test_prefix_tree_layout_and_attention_by_hand():
    ids, mask = _tree_batch(TREE_ROWS, 8)
    plan = plan_prefix_tree(ids, mask)
    assert (plan.n_bins, plan.width) == (1, 7)  # 13 real tokens in 7 slots
    for row, slots in TREE_SLOTS.items():
        picked = plan.rows == row
        assert plan.slots[picked].tolist() == slots and (plan.bins[picked] == 0).all()
        assert plan.positions[picked].tolist() == list(range(len(TREE_ROWS[row])))
    packed, positions = plan.pack(ids)
    assert packed.tolist() == [[1, 2, 5, 6, 7, 8, 9]] and positions.tolist() == [[0, 1, 0, 1, 2, 3, 2]]
    # each slot attends to its row's earlier tokens: slot 6 (row 1's 9) sees 5, 6 and itself, not 7, 8
    expected = [[0], [0, 1], [2], [2, 3], [2, 3, 4], [2, 3, 4, 5], [2, 3, 6]]
    attention = plan.attention[0, 0]
    assert [attention[q].nonzero().flatten().tolist() for q in range(7)] == expected
    back = plan.unpack(packed.unsqueeze(-1).float(), tuple(mask.shape)).squeeze(-1).long()
    assert torch.equal(back, ids * mask)


def test_prefix_tree_only_where_it_saves_and_within_its_width():
    ids, mask = _tree_batch([(1, 2, 3), (2, 2), (3, 1, 1, 1)], 6)  # nothing in common
    assert plan_prefix_tree(ids, mask) is None
    ids, mask = _tree_batch([(4, 4, 4, 4, 4, 4, 4, 1)] + [(9, 9, 9, 9, 9, 9, 9, 2), (9, 9, 9, 9, 9, 9, 9, 3)], 10)
    assert plan_prefix_tree(ids, mask) is not None  # 7 of 24 tokens saved
    ids, mask = _tree_batch([(4, 5, 6, 7, 8, 9, 1, 2), (4, 7, 7, 7, 7, 7, 7, 7)], 10)
    assert plan_prefix_tree(ids, mask).width == 15  # one token of 16 saved
    # four rows of 6 tokens sharing 4: trees of at most 9 slots hold two rows each (6 + 2; a third
    # would make 10)
    ids, mask = _tree_batch([(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 6, 5), (1, 2, 3, 4, 7, 7), (1, 2, 3, 4, 8, 8)], 8)
    plan = plan_prefix_tree(ids, mask, width=9)
    assert (plan.n_bins, plan.width) == (2, 8)
    assert plan_prefix_tree(ids, mask).n_bins == 1  # the default width holds all four: 6 + 2 + 2 + 2


def test_prefix_tree_width_of_least_cost_for_the_layer():
    """Two groups of four 10-token rows (a 6-token prompt, 4 answer tokens of their own). By hand, with a layer of 300
    weights per slot and attention 2 * 4 wide per key: width 10 shares nothing (8 bins of 10: 80 * 380 =
    30400); 20 makes trees [A1 A2 A3] 18, [A4 B1] 20, [B2 B3 B4] 18 in 3 bins (60 * 460 = 27600); 40
    makes [A1..A4 B1 B2 B3] 40 and [B4] 10 in 2 bins (80 * 620 = 49600); 80 and wider one tree of 44
    (44 * 652 = 28688). A cheaper layer makes attention dear enough that sharing nothing wins."""
    answers = [(10 + a, 20 + a, 30 + a, 40 + a) for a in range(4)]
    rows = [(p,) * 6 + a for p in (5, 6) for a in answers]
    ids, mask = _tree_batch(rows, 12)
    plan = plan_prefix_tree(ids, mask, layer_shape=(4, 300))
    assert (plan.n_bins, plan.width) == (3, 20)
    assert packing.forward_cost(plan, hidden_size=4, layer_params=300) == 27600
    costs = {w: packing.forward_cost(plan_prefix_tree(ids, mask, width=w), hidden_size=4, layer_params=300)
             for w in (40, 80, 160, 320, 640, 1024)}
    assert costs == {40: 49600, **dict.fromkeys((80, 160, 320, 640, 1024), 28688)}
    assert plan_prefix_tree(ids, mask, layer_shape=(4, 100)) is None


def _group_batch(vocab: int, seed: int = 0):
    """Two prompts of 5 tokens (sharing a 2-token system prefix) with three answers each of 1-6
    tokens, one answer repeated; prompts left-padded to 6 columns, answers right-padded to 6."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(1, vocab, (2,), generator=g).tolist()
    rows = []
    for _ in range(2):
        prompt = system + torch.randint(1, vocab, (3,), generator=g).tolist()
        answers = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (6, 1, 4)]
        rows += [(prompt, answers[0]), (prompt, answers[1]), (prompt, answers[2]), (prompt, answers[2])]
    ids = torch.zeros(len(rows), 12, dtype=torch.long)
    mask = torch.zeros(len(rows), 12, dtype=torch.bool)
    for r, (prompt, answer) in enumerate(rows):
        ids[r, 6 - len(prompt):6], ids[r, 6:6 + len(answer)] = torch.tensor(prompt), torch.tensor(answer)
        mask[r, 6 - len(prompt):6 + len(answer)] = True
    loss_mask = mask.clone()
    loss_mask[:, :6] = False
    return ids, mask, loss_mask


def test_forward_cost_by_hand():
    ids, mask = _tree_batch(TREE_ROWS, 8)
    # one bin of 7 slots: 7 x (100 weights + 2 x 7 x 4 attention) multiply-adds
    assert packing.forward_cost(plan_prefix_tree(ids, mask), hidden_size=4, layer_params=100) == 7 * (100 + 56)
    # rows of 4, 3, 4 and 2 tokens in bins of the longest row, 4: 4 bins of 4 slots
    assert packing.forward_cost(plan_packing(mask), hidden_size=4, layer_params=100) == 4 * 4 * (100 + 32)


def test_the_cheaper_layout_runs(tiny):
    """The tree runs where the prompts it saves outweigh its wider bins; two long rows sharing a short
    prefix run packed rows (on the tiny model, 64 wide with 41k weights a layer, attention over one
    bin of 230 slots costs more than the 10 tokens saved)."""
    body = tiny.base_model
    # per layer: q, k, v, o (64 x 64), the MLP (3 x 64 x 128), two norms; and half the final norm
    assert packing._layer_shape(body) == (64, 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64 + 64 // 2)
    ids, mask, _ = _group_batch(tiny.config.vocab_size)
    packing_supported(body), prefix_tree_supported(body)
    assert _input_shapes(body, lambda: _hidden_states(body, ids, mask)) == [(1, 30)]
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, tiny.config.vocab_size, (10,), generator=g).tolist()
    rows = [prefix + torch.randint(1, tiny.config.vocab_size, (110,), generator=g).tolist() for _ in range(2)]
    ids, mask = _tree_batch(rows, 120, prompt_start=0)
    assert plan_prefix_tree(ids, mask).width == 230
    assert _input_shapes(body, lambda: _hidden_states(body, ids, mask)) == [(2, 120)]


def test_prefix_tree_computes_each_shared_prefix_once(tiny):
    ids, mask, _ = _group_batch(tiny.config.vocab_size)
    plan = plan_prefix_tree(ids, mask)
    # 2 system tokens once, 3 prompt tokens per prompt, each distinct answer once
    assert int(mask.sum()) == 8 * 5 + 2 * 15 and plan.width * plan.n_bins == 2 + 2 * 3 + 2 * 11
    body = tiny.base_model
    assert packing_supported(body) and prefix_tree_supported(body)
    assert _input_shapes(body, lambda: token_logprobs(tiny, ids, mask)) == [(1, 30)]


def test_prefix_tree_hidden_states_logprobs_values_and_gradients_equal_padded(model, monkeypatch):
    """Shared prompts, a shared system prefix and a repeated answer in a prefix tree: hidden states,
    log-probs, entropies and critic values and their gradients equal the padded forward's. Eager
    attention adds its mask to the scores: it fails the probe and runs packed rows, still equal."""
    body = model.base_model
    if body.config._attn_implementation == "eager":
        with pytest.warns(RuntimeWarning, match="prefix sharing is off for LlamaModel"):
            assert not prefix_tree_supported(body)
    else:
        assert prefix_tree_supported(body)
    ids, mask, loss_mask = _group_batch(model.config.vocab_size)
    critic = build_critic(model)
    torch.nn.init.normal_(critic.head.weight, std=1.0)
    weights = torch.randn(*mask.shape, body.config.hidden_size, generator=torch.Generator().manual_seed(1))
    results = []
    for padded in (False, True):
        if padded:
            monkeypatch.setattr(packing, "packing_supported", lambda body, device=None: False)
        model.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        hidden = _hidden_states(body, ids, mask)
        logp, entropy = token_logprobs(model, ids, mask, temperature=0.8, loss_mask=loss_mask,
                                       chunk_size=5, with_entropy=True)
        values, final = critic.values(ids, mask)
        ((hidden * weights)[mask].sum() + logp.sum() + entropy.sum() + values.sum() + final.sum()).backward()
        results.append(([hidden[mask], logp, entropy, values, final], _grads(model), _grads(critic)))
    (tree_out, tree_policy, tree_critic), (padded_out, padded_policy, padded_critic) = results
    for name, got, expected in zip(("hidden", "logp", "entropy", "values", "final"), tree_out, padded_out):
        # float32 rounding: within 1e-5 of the largest magnitude (critic values reach ~20 under the head's init)
        scale = max(1.0, float(expected.abs().max()))
        assert expected.abs().sum() > 0 and _max_gap(got, expected) <= 1e-5 * scale, name
    _assert_grads_close(tree_policy, padded_policy)
    _assert_grads_close(tree_critic, padded_critic)


def test_prefix_tree_under_lora_and_gradient_checkpointing_equals_padded(tiny, monkeypatch):
    ids, mask, loss_mask = _group_batch(tiny.config.vocab_size, seed=3)
    results = []
    for tree in (True, False):
        model = _with_random_adapters(tiny)
        if tree:
            model.gradient_checkpointing_enable()
            assert prefix_tree_supported(model.base_model)
            assert plan_prefix_tree(ids, mask) is not None
        else:
            monkeypatch.setattr(packing, "prefix_tree_supported", lambda body, device=None: False)
        logp, _ = token_logprobs(model, ids, mask, loss_mask=loss_mask, chunk_size=4)
        logp.sum().backward()
        results.append((logp.detach(), _grads(model)))
    assert _max_gap(results[0][0], results[1][0]) <= 1e-5
    _assert_grads_close(results[0][1], results[1][1])


def test_body_ignoring_the_tree_mask_runs_packed_rows():
    """A body that builds its own causal mask and ignores the 4-D one would let a row see a sibling's
    tokens: the probe finds it (with a warning naming why) and the forward runs packed rows."""
    model = _llama("sdpa").eval()
    body = model.base_model
    original = body.forward
    body.forward = lambda *args, attention_mask=None, **kwargs: original(*args, attention_mask=None, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert packing_supported(body) and not prefix_tree_supported(body)
    assert any("prefix sharing is off for LlamaModel" in str(w.message) for w in caught)
    ids, mask, _ = _group_batch(model.config.vocab_size)
    with torch.no_grad():
        expected = padded_hidden_states(body, ids, mask)
        assert _max_gap(_hidden_states(body, ids, mask)[mask], expected[mask]) <= 1e-5
        # what the tree would have computed in this body is really different
        tree = planned_hidden_states(body, ids, mask, plan_prefix_tree(ids, mask))
        assert _max_gap(tree[mask], expected[mask]) > 1e-4

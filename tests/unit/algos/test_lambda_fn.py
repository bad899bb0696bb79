"""Unit tests for dynamic GAE lambda (docs/algorithms.md#dynamic-gae-lambda): GaeLambdaContext.from_mask,
the built-in lambda functions and resolve_gae_lambda. A test named ``caseN`` re-expresses case N of
AReaL's GAE and lambda tests (tests/test_ppo_gae.py): 6-8 a static lambda, 9, 10 and 18 the VAPO
lambda, 11-15 the relative-position lambda, 16-17 custom functions, 22 the context's token count.

The custom lambda functions used through dotted paths are defined at module level below and are
referred to as ``tests.unit.algos.test_lambda_fn.<name>`` (tests/, tests/unit/ and tests/unit/algos/ are packages).
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import (
    GaeLambdaContext,
    compute_gae,
    relative_position_gae_lambda,
    resolve_gae_lambda,
    vapo_length_adaptive_gae,
)
from lit_ppo.algos import lambda_fn as lambda_fn_module

HERE = "tests.unit.algos.test_lambda_fn"
CALLS: list = []


# ---- custom lambda functions reached through dotted paths ----------------------------------


def half_if_longer_than_two(ctx):
    """Token-mode custom lambda: 0.5 for rows with more than 2 timesteps, else 0."""
    L = ctx.timestep_lengths
    return torch.where(L > 2, torch.full(L.shape, 0.5), torch.zeros(L.shape))


def const_from_kwargs(ctx, value, scale=1.0):
    CALLS.append((value, scale))
    return torch.full(ctx.effective_token_lengths.shape, float(value) * float(scale))


def returns_scalar_tensor(ctx):
    return torch.tensor(0.5)


def returns_list(ctx):
    return [0.5] * ctx.effective_token_lengths.shape[0]


def returns_integer_tensor(ctx):
    return torch.ones(ctx.effective_token_lengths.shape[0], dtype=torch.int64)


def returns_nan(ctx):
    out = torch.full(ctx.effective_token_lengths.shape, 0.5)
    out[0] = float("nan")
    return out


def returns_inf(ctx):
    out = torch.full(ctx.effective_token_lengths.shape, 0.5)
    out[-1] = float("inf")
    return out


def returns_too_many(ctx):
    return torch.full((ctx.effective_token_lengths.shape[0] + 1,), 0.5)


def returns_2d(ctx):
    return torch.full((ctx.effective_token_lengths.shape[0], 1), 0.5)


def returns_float64_with_grad(ctx):
    w = torch.full(ctx.effective_token_lengths.shape, 0.25, dtype=torch.float64, requires_grad=True)
    return w * 2  # 0.5, part of a graph


def returns_out_of_range(ctx):
    return torch.full(ctx.effective_token_lengths.shape, 1.5)


def _ctx(lengths, turns=None, unit="token"):
    L = torch.tensor(lengths, dtype=torch.int64)
    T = torch.tensor(turns if turns is not None else [0] * len(lengths), dtype=torch.int64)
    return GaeLambdaContext(
        effective_token_lengths=L, turn_counts=T, timestep_lengths=L if unit == "token" else T
    )


def _close(actual, expected, atol=1e-6, rtol=1e-6):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.detach().double(), expected, atol=atol, rtol=rtol)


def _mask_with(lengths, T):
    """[B, T] mask with a 2-token prompt then `L` generated tokens per row (label-aligned)."""
    m = torch.zeros(len(lengths), T)
    for b, L in enumerate(lengths):
        m[b, 2 : 2 + L] = 1
    return m


def test_tests_package_importable():
    import importlib

    mod = importlib.import_module(HERE)
    assert mod.half_if_longer_than_two is half_if_longer_than_two


# --------------------------------------------------------------------------------------------
# GaeLambdaContext.from_mask
# --------------------------------------------------------------------------------------------


def test_context_case22_counts_label_aligned_tokens():
    # label-aligned mask [0,1,1,1,0]: 3 generated tokens (EOS included), one turn
    mask = torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.float32)
    tid = torch.tensor([[-1, 0, 0, 0, -1]], dtype=torch.int32)
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid)
    _close(ctx.effective_token_lengths, [3], atol=0, rtol=0)
    _close(ctx.turn_counts, [1], atol=0, rtol=0)
    _close(ctx.timestep_lengths, [3], atol=0, rtol=0)
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid, unit="turn")
    _close(ctx.effective_token_lengths, [3], atol=0, rtol=0)
    _close(ctx.turn_counts, [1], atol=0, rtol=0)
    _close(ctx.timestep_lengths, [1], atol=0, rtol=0)


def test_context_token_mode_without_turn_ids_zero_turn_counts():
    ctx = GaeLambdaContext.from_mask(_mask_with([4, 2, 0], T=7))
    _close(ctx.effective_token_lengths, [4, 2, 0], atol=0, rtol=0)
    _close(ctx.turn_counts, [0, 0, 0], atol=0, rtol=0)
    _close(ctx.timestep_lengths, [4, 2, 0], atol=0, rtol=0)


def test_context_turn_counts_distinct_active_ids_with_gaps():
    # row 0: ids 0,0,2,2,4 all active -> 3 distinct ; row 1: [0,0,0,0,0] -> 1 ;
    # row 2: inactive only -> 0 ; row 3: mask [1,1,0,1,0], ids [0,0,-1,3,-1] -> 2
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 1, 0]], dtype=torch.float32)
    tid = torch.tensor(
        [[0, 0, 2, 2, 4], [0, 0, 0, 0, 0], [-1, -1, -1, -1, -1], [0, 0, -1, 3, -1]], dtype=torch.int64
    )
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid, unit="turn")
    _close(ctx.turn_counts, [3, 1, 0, 2], atol=0, rtol=0)
    _close(ctx.effective_token_lengths, [5, 5, 0, 3], atol=0, rtol=0)
    _close(ctx.timestep_lengths, [3, 1, 0, 2], atol=0, rtol=0)


def test_context_turn_counts_ignore_inactive_tokens():
    # ids [0,0,1,1] with mask [1,1,0,0]: only turn 0 has active tokens -> 1 turn
    mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.float32)
    tid = torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid, unit="turn")
    _close(ctx.turn_counts, [1], atol=0, rtol=0)
    _close(ctx.timestep_lengths, [1], atol=0, rtol=0)
    _close(ctx.effective_token_lengths, [2], atol=0, rtol=0)


def test_context_turn_mode_without_turn_ids_raises():
    with pytest.raises(ValueError):
        GaeLambdaContext.from_mask(torch.ones(2, 3), unit="turn")


def test_context_bool_mask():
    ctx = GaeLambdaContext.from_mask(_mask_with([3, 1], T=6).bool())
    _close(ctx.effective_token_lengths, [3, 1], atol=0, rtol=0)


# --------------------------------------------------------------------------------------------
# VAPO length-adaptive lambda
# --------------------------------------------------------------------------------------------


def test_vapo_case9_token_mode_alpha1():
    # lambda = max(0, 1 - 1/(alpha*L)): L = 4 -> .75, L = 2 -> .5, L = 0 -> 0
    ctx = GaeLambdaContext.from_mask(_mask_with([4, 2, 0], T=7))
    lam = vapo_length_adaptive_gae(ctx, alpha=1.0)
    _close(lam, [0.75, 0.5, 0.0])


def test_vapo_case10_turn_mode():
    # turn counts 2, 1, 0 -> [1 - 1/2, 1 - 1, 0] = [.5, 0, 0]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float32)
    tid = torch.tensor([[0, 0, 1, 1], [0, 0, 0, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid, unit="turn")
    _close(vapo_length_adaptive_gae(ctx, alpha=1.0), [0.5, 0.0, 0.0])


def test_vapo_clamped_at_zero_and_other_alpha():
    # alpha .5: L = 1 -> max(0, 1 - 2) = 0 ; L = 4 -> 1 - 1/2 = .5 ; L = 10 -> 1 - 1/5 = .8
    # alpha 4:  L = 1 -> .75 ; L = 0 -> 0
    _close(vapo_length_adaptive_gae(_ctx([1, 4, 10]), alpha=0.5), [0.0, 0.5, 0.8])
    _close(vapo_length_adaptive_gae(_ctx([1, 0]), alpha=4), [0.75, 0.0])


@pytest.mark.parametrize("alpha", [0, 0.0, -1.0, True, False, float("nan"), "1"])
def test_vapo_invalid_alpha(alpha):
    with pytest.raises(ValueError):
        vapo_length_adaptive_gae(_ctx([3, 4]), alpha=alpha)


def test_vapo_case18_invalid_alpha_empty_batch():
    with pytest.raises(ValueError):
        vapo_length_adaptive_gae(_ctx([]), alpha=0)


def test_vapo_via_lambda_fn_module():
    _close(lambda_fn_module.vapo_length_adaptive_gae(_ctx([4]), alpha=1.0), [0.75])


# --------------------------------------------------------------------------------------------
# relative-position lambda
# --------------------------------------------------------------------------------------------


def test_relpos_case11_lengths_10_and_19():
    q = 0.3
    lam = relative_position_gae_lambda(_ctx([10, 19]), q=q).double()
    # lambda^(L-1) = q
    assert math.isclose(lam[0].item() ** 9, q, rel_tol=1e-5)
    assert math.isclose(lam[1].item() ** 18, q, rel_tol=1e-5)
    # equal relative positions: L=10, step k=5 keeps lambda^5; L=19, step k=9 keeps lambda^10;
    # both are q^(5/9) = 0.512231
    target = q ** (5 / 9)
    assert math.isclose(lam[0].item() ** 5, target, rel_tol=1e-5)
    assert math.isclose(lam[1].item() ** 10, target, rel_tol=1e-5)
    _close(lam, [q ** (1 / 9), q ** (1 / 18)], atol=1e-6)


def test_relpos_case12_short_lengths():
    # L = 0 -> 0 ; L = 1 -> 1 ; L = 2 -> q^(1/1) = .3
    _close(relative_position_gae_lambda(_ctx([0, 1, 2]), q=0.3), [0.0, 1.0, 0.3])


def test_relpos_q_one_and_general():
    # q = 1: 1 for every L >= 1 ; q = .5, L = 3 -> .5^(1/2) = 0.70710678
    _close(relative_position_gae_lambda(_ctx([0, 1, 5]), q=1.0), [0.0, 1.0, 1.0])
    _close(relative_position_gae_lambda(_ctx([3]), q=0.5), [math.sqrt(0.5)])


@pytest.mark.parametrize("q", [True, False, -0.1, 0, 0.0, 1.1, float("nan"), float("inf"), float("-inf")])
def test_relpos_case13_invalid_q(q):
    with pytest.raises(ValueError):
        relative_position_gae_lambda(_ctx([3, 4]), q=q)


def test_relpos_invalid_q_empty_batch():
    with pytest.raises(ValueError):
        relative_position_gae_lambda(_ctx([]), q=1.5)


def test_relpos_case15_turn_mode():
    # turn ids [0,0,1,1,2,2] -> 3 turns -> .3^(1/2) ; [0]*6 -> 1 turn -> 1
    mask = torch.ones(2, 6)
    tid = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    ctx = GaeLambdaContext.from_mask(mask, turn_ids=tid, unit="turn")
    _close(relative_position_gae_lambda(ctx, q=0.3), [math.sqrt(0.3), 1.0])


def test_relpos_case14_end_to_end_through_compute_gae():
    # 10-token response after a 2-token prompt, reward 1 on the last generated token, V = 0,
    # gamma 1, lambda = q^(1/9): at 1-based step k, A_k = lambda^(10-k) = q^((10-k)/9)
    q = 0.3
    T = 12
    mask = _mask_with([10], T=T)
    rewards = torch.zeros(1, T)
    rewards[0, 11] = 1.0
    fn = resolve_gae_lambda("lit_ppo.algos.lambda_fn.relative_position_gae_lambda", {"q": q})
    lam = fn(GaeLambdaContext.from_mask(mask))
    _close(lam, [q ** (1 / 9)])
    adv, ret = compute_gae(rewards, torch.zeros(1, T), mask, gamma=1.0, lam=lam)
    expected = [0.0, 0.0] + [q ** ((10 - k) / 9) for k in range(1, 11)]
    _close(adv, [expected], atol=1e-6)
    _close(ret, [expected], atol=1e-6)
    assert math.isclose(adv[0, 2].item(), q, rel_tol=1e-5)  # first step keeps q
    assert math.isclose(adv[0, 11].item(), 1.0, rel_tol=1e-6)  # last step keeps 1


# --------------------------------------------------------------------------------------------
# resolve_gae_lambda
# --------------------------------------------------------------------------------------------


def test_resolve_case6_static_ignores_kwargs():
    fn = resolve_gae_lambda(0.25, {"alpha": 3.0, "anything": "x"})
    lam = fn(_ctx([3, 0]))
    assert lam.dtype == torch.float32
    _close(lam, [0.25, 0.25])


def test_resolve_case7_static_shape_and_gae():
    # a static lambda needs nothing from the context except the batch size
    fn = resolve_gae_lambda(0.5, {})
    lam = fn(GaeLambdaContext.from_mask(torch.ones(1, 4)))
    _close(lam, [0.5])
    # r [0,0,1,0] m all: A3 = 0, A2 = 1, A1 = .5, A0 = .25
    adv, _ = compute_gae(torch.tensor([[0, 0, 1.0, 0]]), torch.zeros(1, 4), torch.ones(1, 4), lam=lam)
    assert adv.shape == (1, 4)
    _close(adv, [[0.25, 0.5, 1.0, 0.0]])


@pytest.mark.parametrize("value", [0.0, 1.0, 1, 0])
def test_resolve_static_bounds(value):
    _close(resolve_gae_lambda(value, {})(_ctx([1, 2, 3])), [float(value)] * 3)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_resolve_case8_static_non_finite(value):
    with pytest.raises(ValueError, match="Static gae_lambda must be finite"):
        resolve_gae_lambda(value, {})


def test_resolve_builtin_vapo_by_path():
    fn = resolve_gae_lambda("lit_ppo.algos.lambda_fn.vapo_length_adaptive_gae", {"alpha": 1.0})
    _close(fn(GaeLambdaContext.from_mask(_mask_with([4, 2, 0], T=7))), [0.75, 0.5, 0.0])


def test_resolve_case16_custom_token_mode_without_turn_ids():
    fn = resolve_gae_lambda(f"{HERE}.half_if_longer_than_two", {})
    # lengths 4 and 2 -> [.5, 0]
    _close(fn(GaeLambdaContext.from_mask(_mask_with([4, 2], T=7))), [0.5, 0.0])


def test_resolve_passes_kwargs():
    CALLS.clear()
    fn = resolve_gae_lambda(f"{HERE}.const_from_kwargs", {"value": 0.3, "scale": 2.0})
    _close(fn(_ctx([5, 6, 7])), [0.6, 0.6, 0.6])
    assert CALLS == [(0.3, 2.0)]


def test_resolve_case17_scalar_tensor():
    fn = resolve_gae_lambda(f"{HERE}.returns_scalar_tensor", {})
    with pytest.raises(ValueError, match="one value per local trajectory"):
        fn(_ctx([3, 4]))


@pytest.mark.parametrize("name", ["returns_too_many", "returns_2d"])
def test_resolve_wrong_shape(name):
    fn = resolve_gae_lambda(f"{HERE}.{name}", {})
    with pytest.raises(ValueError, match="one value per local trajectory"):
        fn(_ctx([3, 4]))


def test_resolve_not_a_tensor():
    fn = resolve_gae_lambda(f"{HERE}.returns_list", {})
    with pytest.raises(TypeError):
        fn(_ctx([3, 4]))


def test_resolve_not_floating():
    fn = resolve_gae_lambda(f"{HERE}.returns_integer_tensor", {})
    with pytest.raises(TypeError):
        fn(_ctx([3, 4]))


@pytest.mark.parametrize("name", ["returns_nan", "returns_inf"])
def test_resolve_non_finite_result(name):
    fn = resolve_gae_lambda(f"{HERE}.{name}", {})
    with pytest.raises(ValueError):
        fn(_ctx([3, 4]))


def test_resolve_result_detached_float32():
    fn = resolve_gae_lambda(f"{HERE}.returns_float64_with_grad", {})
    lam = fn(_ctx([3, 4]))
    assert lam.dtype == torch.float32
    assert not lam.requires_grad
    _close(lam, [0.5, 0.5])


def test_resolve_range_not_checked():
    fn = resolve_gae_lambda(f"{HERE}.returns_out_of_range", {})
    _close(fn(_ctx([3])), [1.5])

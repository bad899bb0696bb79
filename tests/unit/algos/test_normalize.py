"""Unit tests for ``lit_ppo.algos.normalize`` (docs/algorithms.md#normalisation).

Every expected value below is computed by hand (the arithmetic is in the comments or written out as
a Python expression from the math), never by calling the implementation.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import normalize
from lit_ppo.config import NormConfig
from tests.unit.values import assert_values as _close
from tests.unit.values import tensor as _t


def _cfg(mean_level="batch", std_level="batch", **kw):
    return NormConfig(mean_level=mean_level, std_level=std_level, **kw)


# --------------------------------------------------------------------------------------------
# cfg None, dtype
# --------------------------------------------------------------------------------------------


def test_cfg_none_returns_input_unchanged():
    x = _t([[1.0, -2.0, 3.5], [0.25, 7.0, -9.0]])
    out = normalize(x, None)
    _close(out, [[1.0, -2.0, 3.5], [0.25, 7.0, -9.0]], atol=0, rtol=0)


def test_cfg_none_with_mask_still_unchanged():
    x = _t([1.0, 2.0, 3.0])
    out = normalize(x, None, mask=_t([1.0, 0.0, 1.0]))
    _close(out, [1.0, 2.0, 3.0], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_output_is_float32(dtype):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dtype)
    out = normalize(x, _cfg())
    assert out.dtype == torch.float32
    # mean 2.5, residuals [-1.5, -.5, .5, 1.5], ss = 5, unbiased sigma = sqrt(5/3)
    s = math.sqrt(5 / 3) + 1e-5
    _close(out, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], atol=1e-5)


def test_masked_output_is_float32_2d():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    out = normalize(x, _cfg(), mask=_t([[1.0, 1.0], [1.0, 0.0]]))
    assert out.dtype == torch.float32
    assert out.shape == (2, 2)


# --------------------------------------------------------------------------------------------
# batch-level branches, 1-D
# --------------------------------------------------------------------------------------------


def test_batch_mean_batch_std_unbiased():
    # x = [1,2,3,4]: mean 2.5; residuals [-1.5,-.5,.5,1.5]; ss = 2.25+.25+.25+2.25 = 5
    # unbiased sigma = sqrt(5/3) = 1.2909944
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(eps=0.0))
    s = math.sqrt(5 / 3)
    _close(out, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])


def test_batch_mean_batch_std_biased():
    # biased sigma = sqrt(5/4) = 1.1180340
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(std_unbiased=False, eps=0.0))
    s = math.sqrt(5 / 4)
    _close(out, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])


def test_eps_is_added_to_std_not_variance():
    # sigma = sqrt(5/3) = 1.2909944; eps = 0.5 -> divide by 1.7909944
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(eps=0.5))
    d = math.sqrt(5 / 3) + 0.5
    _close(out, [-1.5 / d, -0.5 / d, 0.5 / d, 1.5 / d])


def test_biased_unbiased_ratio_sqrt_three_halves():
    # [1,2,3] (and [0,1,2]): residuals [-1,0,1], ss = 2; unbiased sigma 1, biased sqrt(2/3).
    for x in ([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]):
        u = normalize(_t(x), _cfg(eps=0.0))
        b = normalize(_t(x), _cfg(std_unbiased=False, eps=0.0))
        _close(u, [-1.0, 0.0, 1.0])
        _close(b, [-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
        # the std of the outputs differs by sqrt(3/2)
        assert math.isclose(b.double().std().item() / u.double().std().item(), math.sqrt(1.5), rel_tol=1e-6)


def test_mean_none_std_batch_is_rms():
    # std around mu = 0: ss = 1+4+9+16 = 30; unbiased sigma = sqrt(30/3) = sqrt(10) (not the std 1.29)
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(mean_level=None, eps=0.0))
    s = math.sqrt(10.0)
    _close(out, [1 / s, 2 / s, 3 / s, 4 / s])


def test_mean_none_std_batch_biased_rms():
    # biased: sqrt(30/4)
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(mean_level=None, std_unbiased=False, eps=0.0))
    s = math.sqrt(7.5)
    _close(out, [1 / s, 2 / s, 3 / s, 4 / s])


def test_std_none_divides_by_one_and_ignores_eps():
    # std_level None: sigma = 1 and eps = 0, so the output is exactly the centred input.
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg(std_level=None, eps=0.5))
    _close(out, [-1.5, -0.5, 0.5, 1.5], atol=0, rtol=0)


def test_mean_none_std_none_is_identity():
    out = normalize(_t([1.0, -2.0, 3.0]), _cfg(mean_level=None, std_level=None, eps=0.5))
    _close(out, [1.0, -2.0, 3.0], atol=0, rtol=0)


def test_statistics_are_float64():
    # 1e7 + [0,1,2,3] is exact in float32, but a float32 sum (4e7 + 6) is not representable
    # (spacing 4 at 4e7). float64 statistics: mean 1e7 + 1.5, residuals [-1.5,-.5,.5,1.5].
    x = torch.tensor([1e7, 1e7 + 1, 1e7 + 2, 1e7 + 3], dtype=torch.float32)
    out = normalize(x, _cfg(eps=0.0))
    s = math.sqrt(5 / 3)
    _close(out, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], atol=1e-5)


# --------------------------------------------------------------------------------------------
# constant inputs, zero masks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-5, 1e-8])
def test_constant_input_gives_zeros(eps):
    out = normalize(_t([3.0, 3.0, 3.0, 3.0]), _cfg(eps=eps))
    _close(out, [0.0, 0.0, 0.0, 0.0], atol=0, rtol=0)


def test_constant_group_gives_zeros_with_group_levels():
    out = normalize(_t([5.0, 5.0, 1.0, 3.0]), _cfg("group", "group"), group_sizes=[2, 2])
    # group 1: zero variance -> 0/(0+eps) = 0 exactly; group 2: [-1, 1]/(sqrt(2)+1e-5)
    assert out[0].item() == 0.0 and out[1].item() == 0.0
    s = math.sqrt(2.0) + 1e-5
    _close(out[2:], [-1 / s, 1 / s])


@pytest.mark.parametrize(
    "cfg",
    [
        NormConfig(mean_level="batch", std_level="batch"),
        NormConfig(mean_level="group", std_level="group", group_size=2),
        NormConfig(mean_level="batch", mean_leave1out=True, std_level=None),
        NormConfig(mean_level=None, std_level="batch"),
    ],
)
def test_all_masked_returns_input(cfg):
    x = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    out = normalize(x, cfg, mask=torch.zeros(2, 3))
    _close(out, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], atol=0, rtol=0)


# --------------------------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------------------------


def test_masked_batch_norm_exact_values_and_zero_outside():
    # x = [[1,2],[3,100]], mask [[1,1],[1,0]]: active [1,2,3], mean 2, residuals [-1,0,1],
    # ss = 2, n = 3, unbiased sigma = 1. The masked 100 is ignored and its output is exactly 0.
    x = _t([[1.0, 2.0], [3.0, 100.0]])
    m = _t([[1.0, 1.0], [1.0, 0.0]])
    out = normalize(x, _cfg(eps=0.0), mask=m)
    _close(out, [[-1.0, 0.0], [1.0, 0.0]])
    assert out[1, 1].item() == 0.0


def test_masked_batch_norm_mean_zero_std_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g) * 3 + 2
    m = (torch.rand(4, 6, generator=g) > 0.4).float()
    m[0, 0] = 1.0
    m[0, 1] = 1.0
    out = normalize(x, _cfg(eps=0.0), mask=m)
    valid = out[m.bool()].double()
    assert abs(valid.mean().item()) < 1e-5
    assert abs(valid.std(unbiased=True).item() - 1.0) < 1e-5
    assert torch.all(out[~m.bool()] == 0)


def test_bool_and_float_masks_agree():
    x = _t([[1.0, 2.0, 7.0], [3.0, 100.0, -4.0]])
    m = _t([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    a = normalize(x, _cfg(), mask=m)
    b = normalize(x, _cfg(), mask=m.bool())
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_masked_outputs_exactly_zero_every_branch():
    x = _t([[1.0, 2.0, 9.0], [3.0, -50.0, 4.0], [6.0, 7.0, 30.0], [8.0, 1.0, -2.0]])
    m = _t([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 0]])
    for cfg in (
        NormConfig(mean_level="batch", std_level="batch"),
        NormConfig(mean_level="batch", mean_leave1out=True, std_level="batch"),
        NormConfig(mean_level="group", std_level="group", group_size=2),
        NormConfig(mean_level="group", mean_leave1out=True, std_level=None, group_size=2),
        NormConfig(mean_level="group", std_level="batch", group_size=2),
        NormConfig(mean_level=None, std_level="batch", std_unbiased=False),
        NormConfig(mean_level=None, std_level=None),
    ):
        out = normalize(x, cfg, mask=m)
        assert torch.all(out[m == 0] == 0), cfg
        assert torch.all(torch.isfinite(out)), cfg


# --------------------------------------------------------------------------------------------
# leave-one-out (the worked cases of AReaL's tests/test_adv_norm_config.py)
# --------------------------------------------------------------------------------------------


def _loo_batch(std_level=None, **kw):
    return NormConfig(mean_level="batch", mean_leave1out=True, std_level=std_level, **kw)


def test_batch_loo_1_to_4():
    # s = 10, n = 4: mu_j = (10 - x_j)/3 = [3, 8/3, 7/3, 2]; x - mu = [-2, -2/3, 2/3, 2]
    out = normalize(_t([[1.0], [2.0], [3.0], [4.0]]), _loo_batch())
    _close(out, [[-2.0], [-2 / 3], [2 / 3], [2.0]], atol=1e-6)


def test_batch_loo_10_20_30():
    # s = 60: mu = [25, 20, 15]; x - mu = [-15, 0, 15]
    out = normalize(_t([[10.0], [20.0], [30.0]]), _loo_batch())
    _close(out, [[-15.0], [0.0], [15.0]], atol=1e-5)


def test_batch_loo_five_zeros_and_a_one():
    # s = 1, n = 6: zeros see mu = 1/5 -> -0.2; the one sees mu = 0 -> 1.0
    out = normalize(_t([0.0, 0.0, 0.0, 1.0, 0.0, 0.0]), _loo_batch())
    _close(out, [-0.2, -0.2, -0.2, 1.0, -0.2, -0.2], atol=1e-6)


def test_batch_loo_2d_first_element():
    # [[1,2,3],[4,5,6]]: s = 21, n = 6; at [0,0]: mu = 20/5 = 4 -> -3; at [1,2]: mu = 15/5 = 3 -> 3
    out = normalize(_t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), _loo_batch())
    # full: mu_j = (21 - x_j)/5 -> x - mu = (6 x - 21)/5
    _close(out, [[(6 * v - 21) / 5 for v in row] for row in ([1, 2, 3], [4, 5, 6])], atol=1e-5)
    assert math.isclose(out[0, 0].item(), -3.0, abs_tol=1e-5)


def test_batch_loo_single_element_passes_through():
    out = normalize(_t([[5.0]]), _loo_batch())
    _close(out, [[5.0]], atol=0, rtol=0)


def test_batch_loo_single_active_element_unbiased_returns_element():
    # n = 1: mu = 0, unbiased sigma = 1 -> x / (1 + eps)
    x = _t([[1.0, 9.0], [4.0, 3.0]])
    m = _t([[1.0, 0.0], [0.0, 0.0]])
    out = normalize(x, _loo_batch("batch", eps=0.0), mask=m)
    _close(out, [[1.0, 0.0], [0.0, 0.0]], atol=0, rtol=0)
    out = normalize(x, _loo_batch("batch"), mask=m)  # default eps 1e-5
    _close(out, [[1.0 / (1.0 + 1e-5), 0.0], [0.0, 0.0]], atol=1e-7)


def test_batch_loo_with_unbiased_std_cancels_baseline_difference():
    # LOO residuals [-2,-2/3,2/3,2] (see above); ss = 4 + 4/9 + 4/9 + 4 = 80/9; sigma = sqrt(80/27)
    # = 1.7213259; output = residual / sigma = [-1.161895, -0.387298, 0.387298, 1.161895]
    # which equals (x - mean)/sigma_unbiased = [-1.5,-.5,.5,1.5]/1.2909944.
    out = normalize(_t([1.0, 2.0, 3.0, 4.0]), _loo_batch("batch", eps=0.0))
    s = math.sqrt(80 / 27)
    _close(out, [-2 / s, -(2 / 3) / s, (2 / 3) / s, 2 / s], atol=1e-6)
    s2 = math.sqrt(5 / 3)
    _close(out, [-1.5 / s2, -0.5 / s2, 0.5 / s2, 1.5 / s2], atol=1e-6)


def test_masked_batch_loo_unbiased_worked_case():
    # x [[1,2],[3,4],[5,6]], mask [[1,1],[1,0],[0,1]]: active 1,2,3,6; s = 12, n = 4.
    # mu_j = (12 - x_j)/3 = [11/3, 10/3, 3, 2]; residuals [-8/3, -4/3, 0, 4]
    # ss = 64/9 + 16/9 + 0 + 16 = 224/9 = 24.889; sigma = sqrt(224/27) = 2.88033
    # outputs [-0.92582, -0.46291, 0.0, 1.38873]
    x = _t([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    m = _t([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    out = normalize(x, _loo_batch("batch", eps=0.0), mask=m)
    s = math.sqrt(224 / 27)
    _close(out, [[-8 / 3 / s, -4 / 3 / s], [0.0, 0.0], [0.0, 4 / s]], atol=1e-6)
    _close(out[m.bool()], [-0.92582, -0.46291, 0.0, 1.38873], atol=1e-4)
    assert out[1, 1].item() == 0.0 and out[2, 0].item() == 0.0


# --------------------------------------------------------------------------------------------
# group-level branches
# --------------------------------------------------------------------------------------------


def test_group_mean_group_std_unbiased():
    # groups [1,3] (mean 2, res [-1,1], ss 2, sigma sqrt 2) and [10,14] (mean 12, res [-2,2], ss 8,
    # sigma sqrt 8): all outputs are +-1/sqrt 2
    out = normalize(_t([1.0, 3.0, 10.0, 14.0]), _cfg("group", "group", group_size=2, eps=0.0))
    r = 1 / math.sqrt(2)
    _close(out, [-r, r, -r, r])


def test_group_size_fallback_equals_explicit_group_sizes():
    x = _t([1.0, 3.0, 10.0, 20.0])
    cfg = _cfg("group", "group", group_size=2, std_unbiased=False, eps=0.0)
    a = normalize(x, cfg)
    b = normalize(x, cfg, group_sizes=[2, 2])
    # biased: group 1 res [-1,1] sigma 1 -> [-1,1]; group 2 res [-5,5] sigma 5 -> [-1,1]
    _close(a, [-1.0, 1.0, -1.0, 1.0])
    _close(b, [-1.0, 1.0, -1.0, 1.0])


def test_group_sizes_override_cfg_group_size():
    # cfg.group_size = 2 would split [1,2 | 3,10]; explicit [3, 1] gives [1,2,3 | 10]
    x = _t([1.0, 2.0, 3.0, 10.0])
    out = normalize(x, _cfg("group", None, group_size=2), group_sizes=[3, 1])
    # group 1 mean 2 -> [-1, 0, 1]; singleton group mean 10 -> 0
    _close(out, [-1.0, 0.0, 1.0, 0.0])


def test_variable_groups_3_2_3_biased_eps0():
    # [0,3,6 | 10,20 | 1,2,3], biased std, eps 0
    # g1: mean 3, res [-3,0,3], var 18/3 = 6, sigma sqrt 6 -> [-3/sqrt6, 0, 3/sqrt6] = [-1.2247, 0, 1.2247]
    # g2: mean 15, res [-5,5], sigma 5 -> [-1, 1]
    # g3: mean 2, res [-1,0,1], sigma sqrt(2/3) -> [-1.2247, 0, 1.2247]
    x = _t([0.0, 3.0, 6.0, 10.0, 20.0, 1.0, 2.0, 3.0])
    cfg = _cfg("group", "group", std_unbiased=False, eps=0.0)
    a = math.sqrt(1.5)
    expected = [-a, 0.0, a, -1.0, 1.0, -a, 0.0, a]
    _close(normalize(x, cfg, group_sizes=[3, 2, 3]), expected)
    _close(normalize(x, cfg, group_sizes=torch.tensor([3, 2, 3])), expected)
    out = normalize(x, cfg, group_sizes=[3, 2, 3]).double()
    for lo, hi in ((0, 3), (3, 5), (5, 8)):
        assert abs(out[lo:hi].mean().item()) < 1e-6


def test_variable_groups_2d_finite_and_values():
    # 2-D, token-weighted within each group; groups of rows [0,1] and [2,3]
    # group 1 active: 1,3,5 -> mean 3, res [-2,0,2], ss 8, unbiased sigma sqrt(8/2) = 2
    # group 2 active: 2,2,8 -> mean 4, res [-2,-2,4], ss 24, unbiased sigma sqrt 12
    x = _t([[1.0, 3.0], [5.0, 50.0], [2.0, 2.0], [8.0, -70.0]])
    m = _t([[1, 1], [1, 0], [1, 1], [1, 0]])
    s = math.sqrt(12.0)
    expected = [[-1.0, 0.0], [1.0, 0.0], [-2 / s, -2 / s], [4 / s, 0.0]]
    _close(normalize(x, _cfg("group", "group", eps=0.0), mask=m, group_sizes=[2, 2]), expected)
    _close(normalize(x, _cfg("group", "group", eps=0.0, group_size=2), mask=m), expected)


def test_group_mean_batch_std_litePPO_residual_std():
    # group-centred residuals [-1,1,-2,2]; sigma is their RMS over the batch (around the per-element
    # group means): ss = 1+1+4+4 = 10, unbiased sigma = sqrt(10/3) = 1.8257 (raw std would be 6.0)
    out = normalize(_t([1.0, 3.0, 10.0, 14.0]), _cfg("group", "batch", group_size=2, eps=0.0))
    s = math.sqrt(10 / 3)
    _close(out, [-1 / s, 1 / s, -2 / s, 2 / s])


def test_batch_mean_group_std():
    # batch mean of [1,3,10,14] = 7; residuals [-6,-4,3,7]
    # std per group around the batch mean: g1 ss = 36+16 = 52 -> sigma sqrt 52; g2 ss = 9+49 = 58
    out = normalize(_t([1.0, 3.0, 10.0, 14.0]), _cfg("batch", "group", group_size=2, eps=0.0))
    a, b = math.sqrt(52.0), math.sqrt(58.0)
    _close(out, [-6 / a, -4 / a, 3 / b, 7 / b])


def test_group_loo_rloo_std_none():
    # groups [1,2,4] (s 7) and [0,0,3] (s 3); mu_j = (s - x_j)/2
    # g1: mu = [3, 2.5, 1.5] -> [-2, -0.5, 2.5]; g2: mu = [1.5, 1.5, 0] -> [-1.5, -1.5, 3]
    cfg = NormConfig(mean_level="group", mean_leave1out=True, std_level=None, group_size=3)
    out = normalize(_t([1.0, 2.0, 4.0, 0.0, 0.0, 3.0]), cfg)
    _close(out, [-2.0, -0.5, 2.5, -1.5, -1.5, 3.0])


def test_group_loo_group_size_one_gives_zeros():
    cfg = NormConfig(mean_level="group", mean_leave1out=True, std_level="group", group_size=1)
    out = normalize(_t([1.0, 2.0, 3.0]), cfg)
    _close(out, [0.0, 0.0, 0.0], atol=0, rtol=0)


def test_singleton_loo_group_gives_zero_among_variable_groups():
    # group_sizes [1, 2]: singleton 7 -> 0; group [1,3]: mu = [3, 1] -> [-2, 2]
    cfg = NormConfig(mean_level="group", mean_leave1out=True, std_level=None)
    out = normalize(_t([7.0, 1.0, 3.0]), cfg, group_sizes=[1, 2])
    _close(out, [0.0, -2.0, 2.0])


def test_singleton_group_without_loo():
    # group_sizes [1, 3]: singleton mean = x -> c = 0; unbiased sigma 1 / biased sigma 0 -> 0 either way
    # group [1,2,3]: mean 2, res [-1,0,1], unbiased sigma 1, biased sqrt(2/3)
    x = _t([5.0, 1.0, 2.0, 3.0])
    out = normalize(x, _cfg("group", "group", eps=0.0), group_sizes=[1, 3])
    _close(out, [0.0, -1.0, 0.0, 1.0])
    out = normalize(x, _cfg("group", "group", std_unbiased=False), group_sizes=[1, 3])
    d = math.sqrt(2 / 3) + 1e-5
    _close(out, [0.0, -1 / d, 0.0, 1 / d])


# --------------------------------------------------------------------------------------------
# group_sizes validation and group_size fallback
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[2, 1], [2, 3], torch.tensor([1, 1, 1])])
def test_group_sizes_sum_mismatch(sizes):
    with pytest.raises(ValueError, match="must equal"):
        normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg("group", "group"), group_sizes=sizes)


@pytest.mark.parametrize("sizes", [[2, 0, 2], [5, -1], torch.tensor([0, 4])])
def test_group_sizes_non_positive(sizes):
    with pytest.raises(ValueError, match="positive"):
        normalize(_t([1.0, 2.0, 3.0, 4.0]), _cfg("group", "group"), group_sizes=sizes)


@pytest.mark.parametrize(
    "cfg",
    [
        NormConfig(mean_level="group", std_level="group", group_size=2),
        NormConfig(mean_level="group", std_level=None, group_size=3),
        NormConfig(mean_level=None, std_level="group", group_size=2),
        NormConfig(mean_level="batch", std_level="group", group_size=4),
        NormConfig(mean_level="group", std_level="batch", group_size=2),
    ],
)
def test_group_size_fallback_must_divide_batch(cfg):
    # B = 5 is not a multiple of the group size: AReaL divides the remainder by eps; we raise.
    with pytest.raises(ValueError):
        normalize(_t([1.0, 2.0, 3.0, 4.0, 5.0]), cfg)


def test_group_size_fallback_not_needed_for_batch_levels():
    # both levels batch: group_size is irrelevant, so B = 5 with group_size 2 is fine
    x = _t([1.0, 2.0, 3.0, 4.0, 5.0])
    out = normalize(x, NormConfig(mean_level="batch", std_level="batch", group_size=2, eps=0.0))
    # mean 3, res [-2,-1,0,1,2], ss 10, unbiased sigma sqrt(10/4)
    s = math.sqrt(2.5)
    _close(out, [-2 / s, -1 / s, 0.0, 1 / s, 2 / s])


def test_group_size_fallback_divides_2d_rows():
    # group_size counts rows, not elements: B = 4 rows of T = 3 with group_size 2 is valid
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    out = normalize(x, NormConfig(mean_level="group", std_level=None, group_size=2))
    # group 1 = rows 0-1 (values 0..5, mean 2.5); group 2 = rows 2-3 (values 6..11, mean 8.5)
    expected = [[v - 2.5 for v in range(0, 3)], [v - 2.5 for v in range(3, 6)],
                [v - 8.5 for v in range(6, 9)], [v - 8.5 for v in range(9, 12)]]
    _close(out, expected)

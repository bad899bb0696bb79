"""Unit tests for the KL estimators, the KL reward, the overlong penalty and reward shaping
(steps 1, 2 and 4 of docs/algorithms.md#advantage-pipeline). Expected values are computed by hand."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.algos import kl_estimate, kl_reward, overlong_penalty, shape_rewards
from tests.unit.values import assert_values as _close, tensor as _t


# logp - base = d = [0.5, -1, 0, 3, -0.5]
LOGP = [0.5, -1.0, -2.0, 2.0, -1.5]
BASE = [0.0, 0.0, -2.0, -1.0, -1.0]
D = [0.5, -1.0, 0.0, 3.0, -0.5]


# --------------------------------------------------------------------------------------------
# kl_estimate
# --------------------------------------------------------------------------------------------


def test_k1_is_log_ratio():
    _close(kl_estimate(_t(LOGP), _t(BASE), "k1"), D)


def test_k2_is_half_squared_log_ratio():
    # d^2/2 = [0.125, 0.5, 0, 4.5, 0.125]
    _close(kl_estimate(_t(LOGP), _t(BASE), "k2"), [0.125, 0.5, 0.0, 4.5, 0.125])


def test_k3_values():
    # exp(-d) - 1 + d:
    #  d = .5  -> 0.60653066 - 0.5 = 0.10653066
    #  d = -1  -> 2.71828183 - 2   = 0.71828183
    #  d = 0   -> 0
    #  d = 3   -> 0.04978707 + 2   = 2.04978707
    #  d = -.5 -> 1.64872127 - 1.5 = 0.14872127
    _close(
        kl_estimate(_t(LOGP), _t(BASE), "k3"),
        [0.10653066, 0.71828183, 0.0, 2.04978707, 0.14872127],
        atol=1e-6,
    )


def test_k3_is_nonnegative_and_k2_symmetric():
    d = torch.linspace(-4, 4, 17)
    k3 = kl_estimate(d, torch.zeros_like(d), "k3")
    assert torch.all(k3 >= 0)
    k2 = kl_estimate(d, torch.zeros_like(d), "k2")
    torch.testing.assert_close(k2, k2.flip(0), atol=1e-6, rtol=0)


def test_estimators_are_unclamped():
    # d = 20: k1 = 20, k2 = 200, k3 = exp(-20) - 1 + 20 = 19.000000002
    logp, base = _t([20.0]), _t([0.0])
    _close(kl_estimate(logp, base, "k1"), [20.0])
    _close(kl_estimate(logp, base, "k2"), [200.0], atol=1e-4)
    _close(kl_estimate(logp, base, "k3"), [19.0], atol=1e-5)


def test_kl_estimate_2d_shape():
    logp = _t([[0.5, -1.0], [0.0, 3.0]])
    out = kl_estimate(logp, torch.zeros(2, 2), "k2")
    _close(out, [[0.125, 0.5], [0.0, 4.5]])


@pytest.mark.parametrize("name", ["k4", "K1", "", "kl", "mse"])
def test_invalid_estimator_raises(name):
    with pytest.raises(ValueError):
        kl_estimate(_t([0.1]), _t([0.0]), name)


# --------------------------------------------------------------------------------------------
# kl_reward
# --------------------------------------------------------------------------------------------


def test_kl_reward_k1_clamped_and_masked():
    # d = [20, -20, 1, 0.5, 7]; clamp(k1, -10, 10) = [10, -10, 1, .5, 7]; kl_ctl .1
    # -> -.1 * [10, -10, 1, .5, 7] * mask[1,1,1,1,0] = [-1, 1, -.1, -.05, 0]
    logp = _t([20.0, -20.0, 1.0, 0.5, 7.0])
    ref = torch.zeros(5)
    mask = _t([1.0, 1.0, 1.0, 1.0, 0.0])
    out = kl_reward(logp, ref, mask, kl_ctl=0.1, estimator="k1")
    _close(out, [-1.0, 1.0, -0.1, -0.05, 0.0])
    assert out[4].item() == 0.0


def test_kl_reward_k2_clamp_upper():
    # d = [5, 1, -2]: k2 = [12.5, .5, 2]; clamp -> [10, .5, 2]; kl_ctl 0.5 -> [-5, -.25, -1]
    logp = _t([[5.0, 1.0, -2.0]])
    out = kl_reward(logp, torch.zeros(1, 3), torch.ones(1, 3), kl_ctl=0.5, estimator="k2")
    _close(out, [[-5.0, -0.25, -1.0]])


def test_kl_reward_k3_clamp_upper():
    # d = -12: k3 = exp(12) - 13 = 162741.8 -> clamp 10; d = -1: 0.71828183; kl_ctl 2
    logp = _t([-12.0, -1.0])
    out = kl_reward(logp, torch.zeros(2), torch.ones(2), kl_ctl=2.0, estimator="k3")
    _close(out, [-20.0, -2 * 0.71828183], atol=1e-5)


def test_kl_reward_masked_positions_zero_for_all_estimators():
    logp = _t([[0.3, -4.0, 2.0], [1.0, 50.0, -50.0]])
    ref = _t([[0.1, 3.0, -8.0], [0.0, 0.0, 0.0]])
    mask = _t([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    for est in ("k1", "k2", "k3"):
        out = kl_reward(logp, ref, mask, kl_ctl=0.7, estimator=est)
        assert torch.all(out[mask == 0] == 0), est
    # k1 active values: -0.7 * 0.2 = -0.14 ; -0.7 * clamp(-50) = +7
    out = kl_reward(logp, ref, mask, kl_ctl=0.7, estimator="k1")
    _close(out, [[-0.14, 0.0, 0.0], [0.0, 0.0, 7.0]], atol=1e-6)


def test_kl_reward_zero_ctl_is_zero():
    out = kl_reward(_t([3.0, -1.0]), _t([0.0, 0.0]), _t([1.0, 1.0]), kl_ctl=0.0, estimator="k1")
    _close(out, [0.0, 0.0], atol=0, rtol=0)


# --------------------------------------------------------------------------------------------
# overlong_penalty
# --------------------------------------------------------------------------------------------


def test_overlong_penalty_values_no_floor():
    # max_new_tokens 20, overlong_tokens 4: the buffer starts at 16.
    # L:        10   16   17     18    20    24      (24 > max: no floor at -1)
    # penalty:   0    0  -1/4  -2/4  -4/4  -8/4
    lengths = torch.tensor([10, 16, 17, 18, 20, 24])
    out = overlong_penalty(lengths, max_new_tokens=20, overlong_tokens=4, factor=1.0)
    assert out.dtype == torch.float32
    assert out.shape == (6,)
    _close(out, [0.0, 0.0, -0.25, -0.5, -1.0, -2.0])


def test_overlong_penalty_factor_scales():
    # factor 0.5: [-1/4, -2/4, -4/4] * 0.5
    out = overlong_penalty(torch.tensor([17, 18, 20]), max_new_tokens=20, overlong_tokens=4, factor=0.5)
    _close(out, [-0.125, -0.25, -0.5])


def test_overlong_penalty_zero_before_buffer_and_nonpositive():
    # max 1024, buffer 256 -> threshold 768; anything <= 768 gives exactly 0
    lengths = torch.tensor([0, 1, 500, 767, 768, 769, 1024])
    out = overlong_penalty(lengths, max_new_tokens=1024, overlong_tokens=256, factor=2.0)
    assert torch.all(out <= 0)
    assert torch.all(out[:5] == 0)
    # 769: -(1/256) * 2 = -0.0078125 ; 1024: -(256/256) * 2 = -2
    _close(out[5:], [-1 / 128, -2.0])


# --------------------------------------------------------------------------------------------
# shape_rewards
# --------------------------------------------------------------------------------------------


def test_shape_rewards_bias_then_scale_then_clip():
    # (r + .5) * 2 then clip to +-5:
    #   1  -> 3 ; -3 -> -5 (=-5 exactly) ; 10 -> 21 -> 5 ; 0 -> 1 ; -4 -> -7 -> -5
    # (clip-then-scale would give 10 for r = 10; scale-then-bias would give 2.5 for r = 1)
    r = _t([1.0, -3.0, 10.0, 0.0, -4.0])
    out = shape_rewards(r, bias=0.5, scaling=2.0, clip=5.0)
    _close(out, [3.0, -5.0, 5.0, 1.0, -5.0])


def test_shape_rewards_identity_defaults():
    r = _t([0.0, 1.0, -19.5, 19.5])
    _close(shape_rewards(r, bias=0.0, scaling=1.0, clip=20.0), [0.0, 1.0, -19.5, 19.5])


def test_shape_rewards_negative_bias_and_fractional_scale():
    # (r - 1) * 0.1, clip 0.25: r = 0 -> -0.1 ; r = 3 -> 0.2 ; r = 10 -> 0.9 -> 0.25 ; r = -5 -> -0.6 -> -0.25
    out = shape_rewards(_t([0.0, 3.0, 10.0, -5.0]), bias=-1.0, scaling=0.1, clip=0.25)
    _close(out, [-0.1, 0.2, 0.25, -0.25])

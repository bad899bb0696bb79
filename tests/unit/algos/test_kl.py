"""Unit tests for the KL estimators and the KL reward (``lit_ppo.algos.kl``; step 4 of
docs/algorithms.md#advantage-pipeline). Expected values are computed by hand."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.algos import kl_estimate, kl_reward
from tests.unit.values import assert_values as _close
from tests.unit.values import tensor as _t

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

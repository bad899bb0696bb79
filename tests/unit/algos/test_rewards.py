"""Unit tests for the overlong penalty and reward shaping (``lit_ppo.algos.rewards``; steps 1 and 2 of
docs/algorithms.md#advantage-pipeline). Expected values are computed by hand."""

from __future__ import annotations

import torch

from lit_ppo.algos import overlong_penalty, shape_rewards
from tests.unit.values import assert_values as _close
from tests.unit.values import tensor as _t

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

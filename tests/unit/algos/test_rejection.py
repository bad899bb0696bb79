"""rejection_sampling (IcePop / KPop filter), docs/algorithms.md#rejection-sampling, in the label-aligned [B, T] layout.

Every expected value below is computed by hand (see the comments) from the specification, with
l = prox_logp - behave_logp. Most cases put prox_logp = l and behave_logp = 0 so that l is exact in
float32 and bound checks are exact.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import rejection_sampling
from lit_ppo.config import RejectionSamplingConfig

RTOL = 1e-5
ATOL = 1e-6
E = math.e


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def _run(ell, mask=None, **cfg):
    """prox = l, behave = 0; mask defaults to all valid."""
    prox = _t(ell)
    behave = torch.zeros_like(prox)
    if mask is None:
        mask_t = torch.ones_like(prox, dtype=torch.bool)
    else:
        mask_t = _t(mask, torch.bool)
    out_mask, weight, stats = rejection_sampling(prox, behave, mask_t, RejectionSamplingConfig(**cfg))
    return out_mask, weight, stats


def _assert_mask(out_mask, expected):
    exp = _t(expected, torch.bool)
    assert out_mask.shape == exp.shape
    assert torch.equal(out_mask.bool(), exp), f"mask {out_mask} != expected {exp}"


def _assert_w(weight, expected):
    torch.testing.assert_close(weight.float(), _t(expected), rtol=RTOL, atol=ATOL)


def _frac(stats):
    f = stats["filtered_fraction"]
    assert torch.is_tensor(f) and f.dim() == 0
    return float(f)


# ---------------------------------------------------------------- token level, mask, ratio


def test_token_mask_ratio_upper():
    # ratio = exp([0, 1, 0]) = [1, 2.718, 1]; upper 2 rejects the middle token.
    m, w, s = _run([[0.0, 1.0, 0.0]], upper=2.0)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[1.0, 0.0, 1.0]])
    assert _frac(s) == pytest.approx(1 / 3, abs=1e-6)


def test_token_mask_ratio_lower():
    # exp(-1) = 0.368 < 0.5 -> rejected.
    m, w, s = _run([[0.0, -1.0, 0.0]], lower=0.5, upper=2.0)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[1.0, 0.0, 1.0]])
    assert _frac(s) == pytest.approx(1 / 3, abs=1e-6)


def test_token_mask_ratio_weight_is_exp_l():
    # Kept tokens carry w = exp(l); IcePop bounds [0.5, 5].
    ell = [[0.3, -0.5, 1.2, 2.0, -1.0]]
    m, w, s = _run(ell, lower=0.5, upper=5.0)
    # exp: 1.3499, 0.6065, 3.3201, 7.389 (> 5), 0.3679 (< 0.5)
    _assert_mask(m, [[1, 1, 1, 0, 0]])
    _assert_w(w, [[math.exp(0.3), math.exp(-0.5), math.exp(1.2), 0.0, 0.0]])
    assert _frac(s) == pytest.approx(2 / 5, abs=1e-6)


def test_token_ratio_lower_bound_inclusive():
    # l = 0 -> ratio exactly 1.0 == lower: kept (inclusive).
    m, w, _ = _run([[0.0, -0.1]], lower=1.0, upper=2.0)
    _assert_mask(m, [[1, 0]])
    _assert_w(w, [[1.0, 0.0]])


def test_token_ratio_upper_ln2_inclusive():
    # l = float32(ln 2); exp gives exactly 2.0 in float32 == upper: kept.
    m, w, _ = _run([[math.log(2.0), 0.0]], upper=2.0)
    _assert_mask(m, [[1, 1]])
    _assert_w(w, [[2.0, 1.0]])


def test_token_kl_k1_bounds_inclusive():
    # k1 = l exactly; both bounds are inclusive: -0.5 and 0.5 kept, -0.75 and 0.75 dropped.
    m, w, _ = _run([[-0.5, 0.5, -0.75, 0.75]], metric="kl_k1", lower=-0.5, upper=0.5)
    _assert_mask(m, [[1, 1, 0, 0]])
    _assert_w(w, [[math.exp(-0.5), math.exp(0.5), 0.0, 0.0]])


def test_token_kl_k2_upper_inclusive():
    # k2 = l^2 / 2: l = 1 -> 0.5 == upper kept; l = -1.5 -> 1.125 dropped; l = -1 -> 0.5 kept.
    m, w, _ = _run([[1.0, -1.5, -1.0]], metric="kl_k2", upper=0.5)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[E, 0.0, math.exp(-1.0)]])


def test_token_mask_zero_weight_where_input_masked():
    # Masked-out positions stay masked and get weight 0, even with a ratio inside the bounds.
    # exp(1.5) = 4.48 <= 5 kept.
    m, w, s = _run([[0.0, 0.2, 1.5, 0.1]], mask=[[1, 0, 1, 0]], upper=5.0)
    _assert_mask(m, [[1, 0, 1, 0]])
    _assert_w(w, [[1.0, 0.0, math.exp(1.5), 0.0]])
    assert _frac(s) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
def test_mask_dtype_accepted(mask_dtype):
    prox = _t([[0.0, 1.0, 0.0]])
    behave = torch.zeros_like(prox)
    mask = _t([[1, 1, 1]], mask_dtype)
    m, w, s = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(upper=2.0))
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[1.0, 0.0, 1.0]])


def test_legacy_token_mask_cap5():
    # Legacy "token_mask, cap 5" == {token, mask, ratio, upper 5}: exp(2) = 7.39 dropped.
    m, w, _ = _run([[0.0, 2.0, -0.5]], upper=5.0)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[1.0, 0.0, math.exp(-0.5)]])


# ---------------------------------------------------------------- token level, other metrics


def test_token_kl_k1_with_bounds():
    # k1 = l: [0, -1, -0.3] in [-0.5, 1] -> keep [1, 0, 1].
    m, w, _ = _run([[0.0, -1.0, -0.3]], metric="kl_k1", lower=-0.5, upper=1.0)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[1.0, 0.0, math.exp(-0.3)]])


def test_token_kl_k1_upper_only():
    m, w, _ = _run([[0.0, 1.0]], metric="kl_k1", upper=0.5)
    _assert_mask(m, [[1, 0]])
    _assert_w(w, [[1.0, 0.0]])


def test_token_kl_k2_unclamped():
    # k2 = l^2/2 unclamped: l = 20 -> 200 (> 150 dropped) , l = 17 -> 144.5 kept (a clamp at 10
    # would keep both).
    m, _, _ = _run([[20.0, 17.0]], metric="kl_k2", upper=150.0)
    _assert_mask(m, [[0, 1]])


def test_token_kl_k3_values():
    # k3 = exp(-l) - 1 + l:
    #   l = 0.5  -> 0.60653 - 0.5 = 0.10653 (kept at 0.5)
    #   l = -0.5 -> 1.64872 - 1.5 = 0.14872 (kept)
    #   l = 2    -> 0.13534 + 1   = 1.13534 (dropped)
    #   l = -1   -> 2.71828 - 2   = 0.71828 (dropped; the help-text form r - log r - 1 would give 0.368)
    m, w, _ = _run([[0.5, -0.5, 2.0, -1.0]], metric="kl_k3", upper=0.5)
    _assert_mask(m, [[1, 1, 0, 0]])
    _assert_w(w, [[math.exp(0.5), math.exp(-0.5), 0.0, 0.0]])
    # Tight bounds around the hand values: upper 0.12 keeps only l = 0.5, upper 0.15 keeps both.
    m, _, _ = _run([[0.5, -0.5]], metric="kl_k3", upper=0.12)
    _assert_mask(m, [[1, 0]])
    m, _, _ = _run([[0.5, -0.5]], metric="kl_k3", upper=0.15)
    _assert_mask(m, [[1, 1]])
    # Distinguish the correct k3 (0.718 at l = -1) from r - log r - 1 (0.368): 0.7 drops, 0.72 keeps.
    m, _, _ = _run([[-1.0]], metric="kl_k3", upper=0.7)
    _assert_mask(m, [[0]])
    m, _, _ = _run([[-1.0]], metric="kl_k3", upper=0.72)
    _assert_mask(m, [[1]])


def _binary_kl(p, q):
    p = min(max(p, 1e-8), 1 - 1e-8)
    q = min(max(q, 1e-8), 1 - 1e-8)

    def kl(a, b):
        return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))

    return max(kl(p, q), kl(q, p))


def test_binary_kl_hand_values():
    # p = 0.5, q = 0.25:
    #   KL(p||q) = .5 ln 2 + .5 ln(2/3) = 0.143841
    #   KL(q||p) = .25 ln .5 + .75 ln 1.5 = 0.130812  -> metric 0.143841
    # p = 0.9, q = 0.1: KL symmetric = 0.8 ln 9 = 1.757780
    # p = q = 0.3: 0
    assert _binary_kl(0.5, 0.25) == pytest.approx(0.1438410362, abs=1e-8)
    assert _binary_kl(0.9, 0.1) == pytest.approx(0.8 * math.log(9), abs=1e-8)
    prox = _t([[math.log(0.5), math.log(0.9), math.log(0.3)]])
    behave = _t([[math.log(0.25), math.log(0.1), math.log(0.3)]])
    mask = torch.ones_like(prox, dtype=torch.bool)

    def run(upper):
        cfg = RejectionSamplingConfig(metric="binary_kl", upper=upper)
        return rejection_sampling(prox, behave, mask, cfg)

    # upper 0.14 < 0.14384 -> token 0 dropped; 1.7578 dropped; 0 kept.
    m, w, s = run(0.14)
    _assert_mask(m, [[0, 0, 1]])
    _assert_w(w, [[0.0, 0.0, 1.0]])
    assert _frac(s) == pytest.approx(2 / 3, abs=1e-6)
    # upper 0.15: token 0 kept (w = 0.5 / 0.25 = 2), token 1 still dropped.
    m, w, _ = run(0.15)
    _assert_mask(m, [[1, 0, 1]])
    _assert_w(w, [[2.0, 0.0, 1.0]])
    # upper 1.75 < 1.75778 < 1.76
    m, _, _ = run(1.75)
    _assert_mask(m, [[1, 0, 1]])
    m, w, _ = run(1.76)
    _assert_mask(m, [[1, 1, 1]])
    _assert_w(w, [[2.0, 9.0, 1.0]])


def test_binary_kl_is_max_of_both_directions():
    # p = 0.5, q = 0.25: KL(p||q) = 0.143841 > KL(q||p) = 0.130812.
    # Swapped (p = 0.25, q = 0.5): same max 0.143841. An upper of 0.135 lies between the two
    # directions, so a one-directional metric would keep one of the two orderings.
    prox = _t([[math.log(0.5), math.log(0.25)]])
    behave = _t([[math.log(0.25), math.log(0.5)]])
    mask = torch.ones_like(prox, dtype=torch.bool)
    m, _, _ = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(metric="binary_kl", upper=0.135))
    _assert_mask(m, [[0, 0]])
    m, _, _ = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(metric="binary_kl", upper=0.144))
    _assert_mask(m, [[1, 1]])


def test_binary_kl_certain_token_clamped():
    # prox = log 1 = 0 -> p = clamp(1, 1e-8, 1 - 1e-8) = 1 - 1e-8; q = 0.5.
    #   KL(p||q) ~ ln 2 = 0.693
    #   KL(q||p) = .5 ln(.5 / (1-1e-8)) + .5 ln(.5 / 1e-8) = .5 (-0.693147 + 17.727534) = 8.517193
    # metric = 8.5172: finite, kept at upper 10, dropped at 8.4.
    expected = _binary_kl(1.0, 0.5)
    assert expected == pytest.approx(8.517193, abs=1e-5)
    prox = _t([[0.0]])
    behave = _t([[math.log(0.5)]])
    mask = torch.ones_like(prox, dtype=torch.bool)
    m, w, _ = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(metric="binary_kl", upper=10.0))
    _assert_mask(m, [[1]])
    _assert_w(w, [[2.0]])
    m, w, _ = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(metric="binary_kl", upper=8.4))
    _assert_mask(m, [[0]])
    _assert_w(w, [[0.0]])


def test_binary_kl_sequence_mean():
    # Sequence mean of binary_kl: row 0 = [0.143841, 0] -> 0.0719; row 1 = [1.757780, 0] -> 0.8789.
    # upper 0.5 keeps row 0 (per-token w = [2, 1]) and drops row 1.
    prox = _t([[math.log(0.5), math.log(0.3)], [math.log(0.9), math.log(0.3)]])
    behave = _t([[math.log(0.25), math.log(0.3)], [math.log(0.1), math.log(0.3)]])
    mask = torch.ones_like(prox, dtype=torch.bool)
    cfg = RejectionSamplingConfig(level="sequence", metric="binary_kl", agg="mean", upper=0.5)
    m, w, s = rejection_sampling(prox, behave, mask, cfg)
    _assert_mask(m, [[1, 1], [0, 0]])
    _assert_w(w, [[2.0, 1.0], [0.0, 0.0]])
    assert _frac(s) == pytest.approx(0.5, abs=1e-6)


# ---------------------------------------------------------------- token level, clamp


def test_token_clamp_upper():
    # clamp: mask unchanged, w = clamp(exp(l), 0, 5): exp(2) = 7.389 -> 5.
    m, w, s = _run([[0.0, 2.0, -0.5]], action="clamp", upper=5.0)
    _assert_mask(m, [[1, 1, 1]])
    _assert_w(w, [[1.0, 5.0, math.exp(-0.5)]])
    assert _frac(s) == pytest.approx(1 / 3, abs=1e-6)


def test_token_clamp_lower_and_upper():
    # exp([-2, 2, 0]) = [0.135, 7.389, 1] clamped to [0.5, 3] -> [0.5, 3, 1]; 2 of 3 changed.
    m, w, s = _run([[-2.0, 2.0, 0.0]], action="clamp", lower=0.5, upper=3.0)
    _assert_mask(m, [[1, 1, 1]])
    _assert_w(w, [[0.5, 3.0, 1.0]])
    assert _frac(s) == pytest.approx(2 / 3, abs=1e-6)


def test_token_clamp_keeps_input_mask_and_zero_weight():
    m, w, s = _run([[3.0, 2.0, -0.5, 9.0]], mask=[[1, 1, 1, 0]], action="clamp", upper=5.0)
    _assert_mask(m, [[1, 1, 1, 0]])
    # exp(3) = 20.1 -> 5; exp(2) = 7.39 -> 5; masked token -> 0.
    _assert_w(w, [[5.0, 5.0, math.exp(-0.5), 0.0]])
    assert _frac(s) == pytest.approx(2 / 3, abs=1e-6)


# ---------------------------------------------------------------- sequence level


def test_sequence_ratio_mean_geometric_weight():
    # mean l = 0.5 -> metric e^0.5 = 1.6487 <= 5 kept; w = e^0.5 on every token.
    m, w, s = _run([[0.0, 0.5, 1.0]], level="sequence", agg="mean")
    _assert_mask(m, [[1, 1, 1]])
    c = math.exp(0.5)
    _assert_w(w, [[c, c, c]])
    assert _frac(s) == pytest.approx(0.0, abs=1e-7)


def test_sequence_ratio_mean_padded_rows():
    # 2-D form of the packed case: rows [0, .6, .3] and [0, 0, pad]. Geometric means e^0.3 and 1;
    # padding excluded from the mean (the pad value 3.0 would change it) and gets weight 0.
    m, w, _ = _run([[0.0, 0.6, 0.3], [0.0, 0.0, 3.0]], mask=[[1, 1, 1], [1, 1, 0]], level="sequence", agg="mean")
    _assert_mask(m, [[1, 1, 1], [1, 1, 0]])
    c = math.exp(0.3)
    _assert_w(w, [[c, c, c], [1.0, 1.0, 0.0]])


def test_sequence_ratio_mean_mask_drops_whole_sequence():
    # Row 0: mean l = (0 + 2 + 2.5)/3 = 1.5 -> e^1.5 = 4.48 <= 5 kept (although exp(2.5) = 12.2 > 5).
    # Row 1: mean l = (2 + 1.8)/2 = 1.9 -> e^1.9 = 6.69 > 5 dropped; 2 of 5 valid tokens rejected.
    m, w, s = _run(
        [[0.0, 2.0, 2.5], [2.0, 1.8, 0.0]], mask=[[1, 1, 1], [1, 1, 0]], level="sequence", agg="mean", upper=5.0
    )
    _assert_mask(m, [[1, 1, 1], [0, 0, 0]])
    c = math.exp(1.5)
    _assert_w(w, [[c, c, c], [0.0, 0.0, 0.0]])
    assert _frac(s) == pytest.approx(2 / 5, abs=1e-6)


def test_sequence_ratio_lower_bound():
    # Row 0 mean l = -1 -> e^-1 = 0.368 < 0.5 dropped; row 1 mean l = -0.5 -> 0.607 kept.
    m, w, _ = _run([[-1.0, -1.0], [-1.0, 0.0]], level="sequence", agg="mean", lower=0.5, upper=5.0)
    _assert_mask(m, [[0, 0], [1, 1]])
    c = math.exp(-0.5)
    _assert_w(w, [[0.0, 0.0], [c, c]])


def test_sequence_kl_k2_weight_stays_per_token():
    # k2 = [0, 0.5, 0] mean 0.1667 <= 5 kept; w stays exp(l) per token = [1, e, 1].
    m, w, _ = _run([[0.0, 1.0, 0.0]], level="sequence", metric="kl_k2", agg="mean")
    _assert_mask(m, [[1, 1, 1]])
    _assert_w(w, [[1.0, E, 1.0]])


def test_sequence_kl_k2_mean_bounds():
    # Row 0 l = [0, 1, 0]: k2 mean = 0.5/3 = 0.1667. Row 1 l = 0: mean 0.
    m, _, _ = _run([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], level="sequence", metric="kl_k2", agg="mean", upper=0.5)
    _assert_mask(m, [[1, 1, 1], [1, 1, 1]])
    # upper 0.1 < 0.1667 drops row 0 only.
    m, w, s = _run([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], level="sequence", metric="kl_k2", agg="mean", upper=0.1)
    _assert_mask(m, [[0, 0, 0], [1, 1, 1]])
    _assert_w(w, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert _frac(s) == pytest.approx(0.5, abs=1e-6)
    # Row 0 l = [0, 2, 0]: k2 mean = 2/3 = 0.667 > 0.5 dropped.
    m, _, _ = _run([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]], level="sequence", metric="kl_k2", agg="mean", upper=0.5)
    _assert_mask(m, [[0, 0, 0], [1, 1, 1]])


def test_sequence_kl_k2_padding_not_counted():
    # Lone valid token with k2 = 2 (l = 2): mean over valid tokens = 2 > 1 -> dropped. Counting the
    # two padded positions would give 2/3 < 1 and keep it.
    m, w, s = _run([[2.0, 0.0, 0.0]], mask=[[1, 0, 0]], level="sequence", metric="kl_k2", agg="mean", upper=1.0)
    _assert_mask(m, [[0, 0, 0]])
    _assert_w(w, [[0.0, 0.0, 0.0]])
    assert _frac(s) == pytest.approx(1.0, abs=1e-6)


def test_sequence_kl_k1_mean():
    # Row 0 l = [0, 1, -0.5]: mean 1/6 = 0.1667 <= 0.5 kept, w per token [1, e, e^-0.5].
    # Row 1 l = [2, 2, 0]: mean 4/3 > 0.5 dropped.
    m, w, s = _run([[0.0, 1.0, -0.5], [2.0, 2.0, 0.0]], level="sequence", metric="kl_k1", agg="mean", upper=0.5)
    _assert_mask(m, [[1, 1, 1], [0, 0, 0]])
    _assert_w(w, [[1.0, E, math.exp(-0.5)], [0.0, 0.0, 0.0]])
    assert _frac(s) == pytest.approx(0.5, abs=1e-6)


def test_sequence_kl_k3_mean():
    # Row 0 l = [0.5, -0.5]: k3 = [0.10653, 0.14872], mean 0.12763. Row 1 l = [2, 0]: mean 0.56767.
    m, _, _ = _run([[0.5, -0.5], [2.0, 0.0]], level="sequence", metric="kl_k3", agg="mean", upper=0.13)
    _assert_mask(m, [[1, 1], [0, 0]])
    m, _, _ = _run([[0.5, -0.5], [2.0, 0.0]], level="sequence", metric="kl_k3", agg="mean", upper=0.125)
    _assert_mask(m, [[0, 0], [0, 0]])
    m, _, _ = _run([[0.5, -0.5], [2.0, 0.0]], level="sequence", metric="kl_k3", agg="mean", upper=0.57)
    _assert_mask(m, [[1, 1], [1, 1]])


def test_sequence_agg_sum_kl_k2():
    # l = 0.5 x4: k2 = 0.125 each, sum 0.5 <= 1 kept. l = 1 x4: k2 = 0.5 each, sum 2 > 1 dropped.
    # (mean would give 0.125 and 0.5, keeping both.)
    m, w, _ = _run([[0.5] * 4, [1.0] * 4], level="sequence", metric="kl_k2", agg="sum", upper=1.0)
    _assert_mask(m, [[1] * 4, [0] * 4])
    _assert_w(w, [[math.exp(0.5)] * 4, [0.0] * 4])


def test_sequence_agg_sum_kl_k2_padding_not_summed():
    # Padded positions (l = 5 there, k2 = 12.5) are excluded from the sum: valid sum = 0.5 kept.
    m, _, _ = _run(
        [[0.5, 0.5, 0.5, 0.5, 5.0]], mask=[[1, 1, 1, 1, 0]], level="sequence", metric="kl_k2", agg="sum", upper=1.0
    )
    _assert_mask(m, [[1, 1, 1, 1, 0]])


def test_sequence_agg_sum_ratio():
    # ratio + sum: metric exp(sum l). Row 0: sum 1.5 -> 4.48 <= 5 kept; w = exp(mean l) = exp(0.5).
    # Row 1: sum 2 -> 7.39 > 5 dropped (mean aggregation would give exp(2/3) = 1.95, kept).
    m, w, _ = _run([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]], level="sequence", agg="sum", upper=5.0)
    _assert_mask(m, [[1, 1, 1], [0, 0, 0]])
    c = math.exp(0.5)
    _assert_w(w, [[c, c, c], [0.0, 0.0, 0.0]])


def test_sequence_agg_max_ratio():
    # max l: row 0 [0, 0, 2] -> e^2 = 7.39 > 3 dropped (mean would give e^(2/3) = 1.95, kept);
    # row 1 [0, .5, 0] -> e^.5 = 1.65 kept, w = geometric mean exp(1/6) broadcast.
    m, w, s = _run([[0.0, 0.0, 2.0], [0.0, 0.5, 0.0]], level="sequence", agg="max", upper=3.0)
    _assert_mask(m, [[0, 0, 0], [1, 1, 1]])
    c = math.exp(0.5 / 3)
    _assert_w(w, [[0.0, 0.0, 0.0], [c, c, c]])
    assert _frac(s) == pytest.approx(0.5, abs=1e-6)


def test_sequence_agg_max_ignores_padding():
    # Padded l = 4 must not enter the max: valid max 0.5 -> kept.
    m, _, _ = _run([[0.0, 0.5, 4.0]], mask=[[1, 1, 0]], level="sequence", agg="max", upper=3.0)
    _assert_mask(m, [[1, 1, 0]])


def test_sequence_agg_max_negative_values_and_empty_row():
    # kl_k1 max over the valid [-1, -0.6] is -0.6: kept at lower -0.8, dropped at lower -0.5 (a max
    # that counted the padded 0 would give 0 and keep it).
    m, _, _ = _run(
        [[-1.0, -0.6, 0.0]], mask=[[1, 1, 0]], level="sequence", metric="kl_k1", agg="max", lower=-0.8, upper=1.0
    )
    _assert_mask(m, [[1, 1, 0]])
    m, _, _ = _run(
        [[-1.0, -0.6, 0.0]], mask=[[1, 1, 0]], level="sequence", metric="kl_k1", agg="max", lower=-0.5, upper=1.0
    )
    _assert_mask(m, [[0, 0, 0]])
    # A row with every token masked gets aggregate 0 -> in bounds; no error, no NaN, weight 0; the
    # fraction counts valid tokens only (row 1 kept -> 0).
    m, w, s = _run(
        [[5.0, 7.0], [0.2, 0.1]], mask=[[0, 0], [1, 1]], level="sequence", metric="kl_k1", agg="max",
        lower=-1.0, upper=1.0,
    )
    _assert_mask(m, [[0, 0], [1, 1]])
    _assert_w(w, [[0.0, 0.0], [math.exp(0.2), math.exp(0.1)]])
    assert _frac(s) == pytest.approx(0.0, abs=1e-7)
    assert torch.isfinite(w).all()


def test_sequence_clamp_geometric_mean():
    # Row 0 l = [0, 4, 0]: geometric mean exp(4/3) = 3.7937 > 3 -> w = [3, 3, 3].
    # Row 1 l = 0: w = [1, 1, 1] unchanged. Mask never changes; 3 of 6 tokens clamped.
    m, w, s = _run([[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]], level="sequence", action="clamp", agg="mean", upper=3.0)
    _assert_mask(m, [[1, 1, 1], [1, 1, 1]])
    _assert_w(w, [[3.0, 3.0, 3.0], [1.0, 1.0, 1.0]])
    assert _frac(s) == pytest.approx(0.5, abs=1e-6)


def test_sequence_clamp_in_bounds_gets_geometric_mean():
    # In-bound sequences keep w = exp(mean l) (not per-token exp(l)): mean of [0, 1] = 0.5.
    # Out-of-bound low sequence (mean -2 -> 0.135 < 0.5) is clamped to 0.5.
    m, w, _ = _run([[0.0, 1.0], [-2.0, -2.0]], level="sequence", action="clamp", agg="mean", lower=0.5, upper=3.0)
    _assert_mask(m, [[1, 1], [1, 1]])
    c = math.exp(0.5)
    _assert_w(w, [[c, c], [0.5, 0.5]])


def test_sequence_clamp_only_out_of_bound_sequences_clamped():
    # ratio + sum, lower 1.5, upper 5. Row 0 l = [.25, .25]: metric exp(.5) = 1.65 in bounds, so its
    # weight, the geometric mean exp(.25) = 1.284 (< lower), is NOT clamped. Row 1 l = [1, 1]:
    # metric exp(2) = 7.39 out of bounds -> geometric mean e = 2.718 is clamped into [1.5, 5]: stays e.
    # Row 2 l = [-.5, 0]: exp(-.5) = .607 out of bounds -> geometric mean exp(-.25) = .779 -> 1.5.
    m, w, s = _run(
        [[0.25, 0.25], [1.0, 1.0], [-0.5, 0.0]], level="sequence", action="clamp", agg="sum", lower=1.5, upper=5.0
    )
    _assert_mask(m, [[1, 1], [1, 1], [1, 1]])
    a = math.exp(0.25)
    _assert_w(w, [[a, a], [E, E], [1.5, 1.5]])


# ---------------------------------------------------------------- edge cases


def test_empty_mask():
    m, w, s = _run([[0.0, 3.0], [1.0, -2.0]], mask=[[0, 0], [0, 0]], upper=2.0)
    _assert_mask(m, [[0, 0], [0, 0]])
    _assert_w(w, [[0.0, 0.0], [0.0, 0.0]])
    assert _frac(s) == pytest.approx(0.0, abs=1e-7)
    m, w, s = _run([[0.0, 3.0]], mask=[[0, 0]], level="sequence", agg="mean", upper=2.0)
    _assert_w(w, [[0.0, 0.0]])
    assert _frac(s) == pytest.approx(0.0, abs=1e-7)


def test_single_token_dropped_fraction_one():
    m, w, s = _run([[1.0]], upper=2.0)
    _assert_mask(m, [[0]])
    _assert_w(w, [[0.0]])
    assert _frac(s) == pytest.approx(1.0, abs=1e-7)


def test_everything_filtered_fraction_one():
    m, w, s = _run([[3.0, 4.0], [2.0, 5.0]], mask=[[1, 1], [1, 0]], upper=2.0)
    _assert_mask(m, [[0, 0], [0, 0]])
    _assert_w(w, [[0.0, 0.0], [0.0, 0.0]])
    assert _frac(s) == pytest.approx(1.0, abs=1e-7)


def test_stats_are_0d_tensors():
    _, _, s = _run([[0.0, 1.0, 0.0]], upper=2.0)
    assert "filtered_fraction" in s
    for k, v in s.items():
        assert torch.is_tensor(v) and v.dim() == 0, k


@pytest.mark.parametrize(
    "cfg",
    [
        dict(),
        dict(metric="kl_k1", lower=-1.0, upper=1.0),
        dict(metric="kl_k2", upper=1.0),
        dict(metric="kl_k3", upper=1.0),
        dict(metric="binary_kl", upper=2.0),
        dict(action="clamp", upper=5.0),
        dict(level="sequence", agg="mean"),
        dict(level="sequence", agg="max"),
        dict(level="sequence", agg="sum", metric="kl_k2", upper=1.0),
        dict(level="sequence", action="clamp", agg="mean", upper=3.0),
    ],
)
def test_non_finite_logp_no_nan(cfg):
    ninf = float("-inf")
    # Valid token 0: -inf - (-inf) (NaN) -> l replaced by 0 -> w = 1.
    # Masked token 2: -inf vs 0 (l = -inf).
    prox = _t([[ninf, -0.5, ninf, -1.0]])
    behave = _t([[ninf, -0.5, 0.0, -1.0]])
    mask = _t([[1, 1, 0, 1]], torch.bool)
    m, w, s = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(**cfg))
    assert not torch.isnan(w).any()
    assert torch.isfinite(w).all()
    for k, v in s.items():
        assert torch.isfinite(v).all(), k
    assert float(w[0, 2]) == 0.0
    assert not bool(m.bool()[0, 2])
    # l = [0, 0, *, 0] on valid tokens -> every metric in bounds (binary_kl: p = q), w = 1 there.
    _assert_mask(m, [[1, 1, 0, 1]])
    _assert_w(w, [[1.0, 1.0, 0.0, 1.0]])


def test_neg_inf_behave_on_valid_token_no_nan():
    # l = 0 - (-inf) = +inf is non-finite -> replaced by 0.
    prox = _t([[0.0, -0.2]])
    behave = _t([[float("-inf"), -0.2]])
    mask = torch.ones_like(prox, dtype=torch.bool)
    m, w, s = rejection_sampling(prox, behave, mask, RejectionSamplingConfig(upper=2.0))
    assert torch.isfinite(w).all()
    assert torch.isfinite(s["filtered_fraction"])


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 3), (2, 4), (2, 3)),
        ((2, 3), (2, 3), (2, 4)),
        ((2, 3), (3, 3), (2, 3)),
    ],
)
def test_shape_mismatch_raises(shapes):
    sp, sb, sm = shapes
    with pytest.raises(ValueError, match="shape"):
        rejection_sampling(torch.zeros(sp), torch.zeros(sb), torch.ones(sm, dtype=torch.bool),
                           RejectionSamplingConfig())


@pytest.mark.parametrize("shape", [(6,), (1, 2, 3)])
def test_ndim_not_two_raises(shape):
    with pytest.raises(ValueError, match="shape"):
        rejection_sampling(torch.zeros(shape), torch.zeros(shape), torch.ones(shape, dtype=torch.bool),
                           RejectionSamplingConfig())


def test_inputs_not_modified():
    prox = _t([[0.0, 3.0, 0.0]])
    behave = torch.zeros_like(prox)
    mask = torch.ones_like(prox, dtype=torch.bool)
    rejection_sampling(prox, behave, mask, RejectionSamplingConfig(upper=2.0))
    assert torch.equal(mask, torch.ones_like(mask))
    torch.testing.assert_close(prox, _t([[0.0, 3.0, 0.0]]), rtol=0, atol=0)


# ====================================================================== verl's seq_mean_k1


def verl_seq_mean_k1_keeps(row_log_ratios: list[float], threshold: str) -> bool:
    """verl's ``rollout_rs=seq_mean_k1`` (verl/trainer/ppo/rollout_corr_helper.py, compute_rollout_rejection_mask),
    by hand: token k1 = -l (l clamped to +-20), a row is kept iff log(lower) <= mean_t k1 <= log(upper) for
    ``rollout_rs_threshold="lower_upper"``."""
    lower, upper = (float(x) for x in threshold.split("_"))
    k1 = [-min(max(v, -20.0), 20.0) for v in row_log_ratios]
    return math.log(lower) <= sum(k1) / len(k1) <= math.log(upper)


def test_geo_mask_with_reciprocal_bounds_keeps_exactly_the_rows_verls_seq_mean_k1_keeps():
    # verl bounds exp(-mean l), lit_ppo exp(mean l): verl's "0.999_1.001" is lit_ppo's band [1/1.001, 1/0.999].
    # One-token rows whose log gap l runs over [-0.0011, 0.0011] in steps of 1e-5 (every edge is >= 5e-7 away).
    gaps = [k * 1e-5 for k in range(-110, 111)]
    verl = [verl_seq_mean_k1_keeps([g], "0.999_1.001") for g in gaps]
    seq = {"level": "sequence", "metric": "ratio", "agg": "mean"}
    kept, _, _ = _run([[g] for g in gaps], **seq, lower=0.999000999, upper=1.001001001)  # 1 / 1.001, 1 / 0.999
    assert kept[:, 0].tolist() == verl
    # The band [0.999, 1.001] read the other way round differs at both edges, by 1.0e-6 in the geometric mean:
    # a row at l = -0.001 (geometric mean 0.9990005) is kept there and dropped by verl, one at l = +0.001 the reverse.
    kept, _, _ = _run([[g] for g in gaps], **seq, lower=0.999, upper=1.001)
    differ = [g for g, ours, theirs in zip(gaps, kept[:, 0].tolist(), verl) if ours != theirs]
    assert differ == pytest.approx([-0.001, 0.001])
    assert 1 / 0.999 - 1.001 == pytest.approx(1.0e-6, rel=1e-2)
    assert 0.999 - 1 / 1.001 == pytest.approx(-1.0e-6, rel=1e-2)


def test_geo_mask_weighs_a_kept_row_by_its_geometric_mean_where_verls_decoupled_geo_rs_weighs_it_1():
    # verl's RolloutCorrectionConfig.decoupled_geo_rs sets rollout_is=None (no weight): a kept row's loss differs by
    # the factor exp(mean l), at most 1/0.999 - 1 = 1.001e-3 inside verl's band.
    _, weight, _ = _run([[0.0009, 0.0009], [-0.0005, 0.0003]], level="sequence", metric="ratio", agg="mean",
                        lower=0.999000999, upper=1.001001001)
    _assert_w(weight, [[math.exp(0.0009)] * 2, [math.exp(-0.0001)] * 2])
    assert float((weight - 1).abs().max()) <= 1 / 0.999 - 1

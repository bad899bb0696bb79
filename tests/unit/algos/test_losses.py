"""policy_loss and value_loss (docs/algorithms.md#policy-losses, docs/algorithms.md#value-loss).

Conventions: old_logp = 0 so the ratio is r = exp(logp); expected values are worked by hand in the
comments (or from the closed-form math with the `math` module), never from the implementation.
Gradients are checked with autograd against the analytic gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import policy_loss, value_loss
from lit_ppo.config import PPOActorConfig

RTOL = 1e-5
ATOL = 1e-6
LN = math.log


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def _close(actual, expected, rtol=RTOL, atol=ATOL):
    if not torch.is_tensor(expected):
        expected = _t(expected)
    torch.testing.assert_close(actual.detach().float(), expected.float(), rtol=rtol, atol=atol)


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _run(ell, adv, mask=None, cfg=None, behave=None, old=None, **kw):
    """logp = ell (requires grad), old_logp = 0 unless given. Returns loss, stats, grad wrt logp."""
    logp = _t(ell).requires_grad_(True)
    old_logp = torch.zeros_like(logp) if old is None else _t(old)
    adv_t = _t(adv)
    mask_t = torch.ones_like(logp, dtype=torch.bool) if mask is None else _t(mask, torch.bool)
    beh = None if behave is None else _t(behave)
    cfg = cfg if cfg is not None else PPOActorConfig()
    loss, stats = policy_loss(logp, old_logp, adv_t, mask_t, cfg, behave_logp=beh, **kw)
    assert loss.dim() == 0
    loss.backward()
    return loss, stats, logp.grad


def _stat(stats, key):
    v = stats[key]
    assert torch.is_tensor(v) and v.dim() == 0, key
    return float(v)


# ====================================================================== PPO clip, token level


def test_ppo_clip_values_gradient_and_clip_fraction():
    # eps = 0.2, band [0.8, 1.2]. (r, A) -> L1 = -A r, L2 = -A clip(r), L = max; clipped iff L1 < L2.
    #   (1.5,  1): L1 -1.5, L2 -1.2 -> -1.2  clipped   grad 0
    #   (0.5,  1): L1 -0.5, L2 -0.8 -> -0.5  no        grad -A r/N = -0.5/6
    #   (1.5, -1): L1  1.5, L2  1.2 ->  1.5  no        grad +1.5/6
    #   (0.5, -1): L1  0.5, L2  0.8 ->  0.8  clipped   grad 0
    #   (1.1,  2): L1 -2.2, L2 -2.2 -> -2.2  no        grad -2.2/6
    #   (1.5,  0): 0 = 0            ->  0    no (strict) grad 0
    #   masked (3.0, 5): ignored
    # loss = (-1.2 - 0.5 + 1.5 + 0.8 - 2.2 + 0) / 6 = -1.6 / 6
    ell = [[LN(1.5), LN(0.5), LN(1.5), LN(0.5), LN(1.1), LN(1.5), LN(3.0)]]
    adv = [[1.0, 1.0, -1.0, -1.0, 2.0, 0.0, 5.0]]
    mask = [[1, 1, 1, 1, 1, 1, 0]]
    loss, stats, grad = _run(ell, adv, mask, PPOActorConfig(eps_clip=0.2))
    _close(loss, -1.6 / 6)
    _close(grad, [[0.0, -0.5 / 6, 1.5 / 6, 0.0, -2.2 / 6, 0.0, 0.0]])
    assert _stat(stats, "clip_fraction") == pytest.approx(2 / 6, abs=1e-6)
    assert _stat(stats, "dual_clip_fraction") == pytest.approx(0.0, abs=1e-7)
    # importance_weight_mean: masked mean of r = (1.5 + .5 + 1.5 + .5 + 1.1 + 1.5) / 6 = 1.1
    assert _stat(stats, "importance_weight_mean") == pytest.approx(1.1, abs=1e-5)


def test_approx_kl_stat_is_k3_of_old_vs_new():
    # approx_kl is the k3 estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old:
    # mean over valid tokens of (r - 1) - log r, which is >= 0 (unlike the signed mean log-ratio).
    # r = [1.5, .5, 1.1, (masked) 3]:
    #   1.5: .5 - .405465 = .094535 ; .5: -.5 + .693147 = .193147 ; 1.1: .1 - .095310 = .004690
    #   mean = (.094535 + .193147 + .004690) / 3 = .097457
    ell = [[LN(1.5), LN(0.5), LN(1.1), LN(3.0)]]
    _, stats, _ = _run(ell, [[1.0, 1.0, 1.0, 1.0]], [[1, 1, 1, 0]])
    assert _stat(stats, "approx_kl") == pytest.approx(0.097457, abs=1e-5)


def test_ppo_asymmetric_clip_higher():
    # eps_lo = 0.2, eps_hi = 0.28: band [0.8, 1.28].
    #   (1.5,   1): clip -> -1.28, clipped, grad 0
    #   (1.25,  1): in band -> -1.25, grad -1.25/5 (symmetric 0.2 would clip to -1.2)
    #   (0.5,  -1): clip -> 0.8, clipped
    #   (0.75, -1): L1 .75 < L2 .8 -> 0.8, clipped
    #   (0.85, -1): in band -> 0.85, grad +0.85/5
    # loss = (-1.28 - 1.25 + 0.8 + 0.8 + 0.85) / 5 = -0.08 / 5
    ell = [[LN(1.5), LN(1.25), LN(0.5), LN(0.75), LN(0.85)]]
    adv = [[1.0, 1.0, -1.0, -1.0, -1.0]]
    loss, stats, grad = _run(ell, adv, cfg=PPOActorConfig(eps_clip=0.2, eps_clip_higher=0.28))
    _close(loss, -0.08 / 5)
    _close(grad, [[0.0, -1.25 / 5, 0.0, 0.0, 0.85 / 5]])
    assert _stat(stats, "clip_fraction") == pytest.approx(3 / 5, abs=1e-6)


def test_ppo_dual_clip():
    # eps 0.2, c = 3; L3 = c |A| = min-ed in.
    #   (5,   -1):  L = max(5, 1.2) = 5 -> min(5, 3) = 3      dual, grad 0
    #   (2,   -1):  L = 2 < 3                                  grad +2/6
    #   (5,    1):  L = max(-5, -1.2) = -1.2, clipped         grad 0 (A > 0: dual never binds)
    #   (4, -0.5):  L = max(2, 0.6) = 2 -> min(2, 1.5) = 1.5  dual, grad 0
    #   (0.5, -2):  L = max(1, 1.6) = 1.6 (clipped) < 6       grad 0
    #   (1,    0):  0
    # loss = (3 + 2 - 1.2 + 1.5 + 1.6 + 0) / 6 = 6.9 / 6
    # clip_mask (L1 < L2): tokens 3 and 5 -> 2/6; dual: tokens 1 and 4 -> 2/6
    ell = [[LN(5.0), LN(2.0), LN(5.0), LN(4.0), LN(0.5), 0.0]]
    adv = [[-1.0, -1.0, 1.0, -0.5, -2.0, 0.0]]
    loss, stats, grad = _run(ell, adv, cfg=PPOActorConfig(eps_clip=0.2, c_clip=3.0))
    _close(loss, 6.9 / 6)
    _close(grad, [[0.0, 2.0 / 6, 0.0, 0.0, 0.0, 0.0]])
    assert _stat(stats, "dual_clip_fraction") == pytest.approx(2 / 6, abs=1e-6)
    assert _stat(stats, "clip_fraction") == pytest.approx(2 / 6, abs=1e-6)


def test_ppo_dual_clip_inactive_for_positive_advantage():
    # A > 0: L <= 0 < c|A| so c_clip = 1.5 never binds. r = [10, 0.1, 1.1], A = [1, 2, 3]:
    #   L = [-1.2, -0.2, -3.3] -> loss = -4.7 / 3 with and without c_clip.
    ell = [[LN(10.0), LN(0.1), LN(1.1)]]
    adv = [[1.0, 2.0, 3.0]]
    for cfg in (PPOActorConfig(c_clip=1.5), PPOActorConfig()):
        loss, stats, grad = _run(ell, adv, cfg=cfg)
        _close(loss, -4.7 / 3)
        _close(grad, [[0.0, -0.2 / 3, -3.3 / 3]])
        assert _stat(stats, "dual_clip_fraction") == pytest.approx(0.0, abs=1e-7)


def test_ratio_one_equals_reinforce_gradient():
    # r = 1: loss = -sum(A)/N and d loss / d logp = -A/N, the REINFORCE term -sum(A logp)/N.
    adv = [[0.5, -1.5, 2.0, 3.0], [1.0, -0.25, 7.0, -9.0]]
    mask = [[1, 1, 1, 0], [1, 1, 0, 0]]
    loss, _, grad = _run([[0.0] * 4] * 2, adv, mask)
    n = 5
    _close(loss, -(0.5 - 1.5 + 2.0 + 1.0 - 0.25) / n)
    _close(grad, [[-0.5 / n, 1.5 / n, -2.0 / n, 0.0], [-1.0 / n, 0.25 / n, 0.0, 0.0]])


def test_in_band_gradient_is_minus_a_r_over_n():
    g = torch.Generator().manual_seed(0)
    ell = (torch.rand(3, 5, generator=g) * 0.3 - 0.15)  # within [ln .8, ln 1.2] = [-0.223, 0.182]
    adv = torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    n = int(mask.sum())
    loss, _, grad = _run(ell.tolist(), adv.tolist(), mask.int().tolist())
    r = torch.exp(ell)
    _close(loss, -(adv * r * mask).sum() / n)
    _close(grad, -adv * r * mask / n)


def test_num_tokens_overrides_denominator():
    # r = 1: loss = -sum(A)/num_tokens = -(1 + 2 + 3)/10
    loss, _, grad = _run([[0.0, 0.0, 0.0]], [[1.0, 2.0, 3.0]], num_tokens=10)
    _close(loss, -0.6)
    _close(grad, [[-0.1, -0.2, -0.3]])


def _batch():
    ell = [
        [0.1, LN(1.5), -0.05, 0.0],
        [LN(0.5), 0.02, 0.3, -2.0],
        [0.0, -0.1, 0.15, 0.05],
        [LN(0.6), LN(1.4), 0.0, 0.07],
    ]
    adv = [
        [1.0, 2.0, -0.5, 4.0],
        [-1.0, 0.5, 3.0, 1.0],
        [0.2, -0.7, 1.1, 0.0],
        [-2.0, 1.5, 0.3, -0.4],
    ]
    mask = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]
    behave = [
        [-0.1, 0.2, 0.0, 0.0],
        [0.0, -2.0, 0.1, 0.0],
        [0.3, 0.0, 0.0, 0.0],
        [-0.2, 0.0, 1.0, 0.05],
    ]
    return ell, adv, mask, behave


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(eps_clip_higher=0.28, c_clip=2.0),
        dict(importance_sampling_level="sequence"),
        dict(use_sapo_loss=True),
        dict(use_decoupled_loss=True),
        dict(use_decoupled_loss=True,
             rejection_sampling=dict(level="token", action="mask", metric="ratio", lower=0.5, upper=5.0)),
    ],
)
def test_micro_batches_with_global_num_tokens_sum_to_full_batch(kw):
    ell, adv, mask, behave = _batch()
    cfg = PPOActorConfig(**kw)
    beh = behave if cfg.use_decoupled_loss else None
    n_total = sum(map(sum, mask))  # 13
    full_loss, _, full_grad = _run(ell, adv, mask, cfg, behave=beh)
    parts = [slice(0, 2), slice(2, 4)]
    total = 0.0
    grads = []
    for p in parts:
        b = None if beh is None else beh[p]
        loss, _, grad = _run(ell[p], adv[p], mask[p], cfg, behave=b, num_tokens=n_total)
        total = total + loss.detach()
        grads.append(grad)
    _close(total, full_loss)
    _close(torch.cat(grads), full_grad)


# ====================================================================== GSPO (sequence level)


def test_gspo_ratio_one_mean_advantage():
    # r = 1: L_t = -Abar_i. Abar = [2.5, 0.5] -> loss = (-2.5*4 - 0.5*4) / 8 = -1.5.
    cfg = PPOActorConfig(importance_sampling_level="sequence")
    loss, stats, grad = _run([[0.0] * 4] * 2, [[1.0, 2.0, 3.0, 4.0], [0.5] * 4], cfg=cfg)
    _close(loss, -1.5)
    _close(grad, [[-2.5 / 8] * 4, [-0.5 / 8] * 4])
    assert _stat(stats, "importance_weight_mean") == pytest.approx(1.0, abs=1e-6)


def _gspo_case(pad_adv):
    # Row 0: l = [.1, -.05, .02, .03], mean .025, s0 = e^.025; A = [1, 2, 3, 4], Abar 2.5.
    # Row 1: valid l = [.04, -.02], mean .01, s1 = e^.01; A valid [-1, 0], Abar -0.5.
    #        padded l = [5, -3] (mean over all 4 would be .505 -> clipped) and padded A = pad_adv.
    # N = 6. loss = (4 * (-2.5 s0) + 2 * (0.5 s1)) / 6
    # grad row 0: -Abar s0 / N = -2.5 s0 / 6; row 1 valid: +0.5 s1 / 6; padding 0.
    ell = [[0.1, -0.05, 0.02, 0.03], [0.04, -0.02, 5.0, -3.0]]
    adv = [[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, pad_adv, pad_adv]]
    mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    return _run(ell, adv, mask, PPOActorConfig(importance_sampling_level="sequence"))


def test_gspo_sequence_ratio_and_gradient():
    s0, s1 = math.exp(0.025), math.exp(0.01)
    loss, stats, grad = _gspo_case(100.0)
    _close(loss, (4 * (-2.5 * s0) + 2 * (0.5 * s1)) / 6)
    _close(grad, [[-2.5 * s0 / 6] * 4, [0.5 * s1 / 6, 0.5 * s1 / 6, 0.0, 0.0]])
    # importance weight s_i on every valid token: mean (4 s0 + 2 s1) / 6
    assert _stat(stats, "importance_weight_mean") == pytest.approx((4 * s0 + 2 * s1) / 6, abs=1e-5)
    assert _stat(stats, "clip_fraction") == pytest.approx(0.0, abs=1e-7)


def test_gspo_masked_padding_advantages_do_not_change_loss():
    s0, s1 = math.exp(0.025), math.exp(0.01)
    expected = (4 * (-2.5 * s0) + 2 * (0.5 * s1)) / 6
    for pad in (100.0, -7.0, 0.0):
        loss, _, _ = _gspo_case(pad)
        _close(loss, expected)


def test_gspo_clipped_sequence_has_zero_gradient():
    # Row 0: l = .5 everywhere, s = e^.5 = 1.6487 > 1.2, Abar = 1 -> L = -1.2 per token, grad 0.
    # Row 1: l = 0, A = [2, -1, .5], Abar = .5 -> L = -.5 per token, grad -.5/6.
    # loss = (3 * -1.2 + 3 * -0.5) / 6 = -0.85; clipped tokens 3/6.
    cfg = PPOActorConfig(importance_sampling_level="sequence", eps_clip=0.2)
    loss, stats, grad = _run([[0.5] * 3, [0.0] * 3], [[1.0] * 3, [2.0, -1.0, 0.5]], cfg=cfg)
    _close(loss, -0.85)
    _close(grad, [[0.0] * 3, [-0.5 / 6] * 3])
    assert _stat(stats, "clip_fraction") == pytest.approx(0.5, abs=1e-6)


def test_gspo_differs_from_token_level():
    # Token level: r = [e^.3, e^-.3] (1.35 clipped at A = 1 -> -1.2; .741 -> -.741): loss = -1.941/2.
    # Sequence level: s = e^0 = 1 -> loss = -1.
    ell, adv = [[0.3, -0.3]], [[1.0, 1.0]]
    tok, _, _ = _run(ell, adv, cfg=PPOActorConfig())
    seq, _, _ = _run(ell, adv, cfg=PPOActorConfig(importance_sampling_level="sequence"))
    _close(tok, -(1.2 + math.exp(-0.3)) / 2)
    _close(seq, -1.0)


def test_gspo_uses_post_rejection_mask():
    # Decoupled + IcePop {token, mask, ratio, 0.5, 5}; old = 0, behave = [0, 0, -2] -> w = [1, 1, e^2];
    # e^2 = 7.39 > 5 rejects token 2. Post-rejection mask [1, 1, 0]:
    #   s = exp(mean(.1, .1)) = e^.1 = 1.10517 (in band), Abar = (1 + 2)/2 = 1.5.
    #   (Counting token 2 would give s = e^(1.1/3) = 1.443, clipped, and Abar = 13/3.)
    # L kept = -1.5 s each; N = 3 (pre-rejection) -> loss = -2 * 1.5 * s / 3 = -s.
    # grad kept tokens: -Abar s / N = -1.5 s / 3; rejected token: 0.
    cfg = PPOActorConfig(
        importance_sampling_level="sequence",
        use_decoupled_loss=True,
        rejection_sampling=dict(level="token", action="mask", metric="ratio", lower=0.5, upper=5.0),
    )
    s = math.exp(0.1)
    loss, stats, grad = _run([[0.1, 0.1, 0.9]], [[1.0, 2.0, 10.0]], cfg=cfg, behave=[[0.0, 0.0, -2.0]])
    _close(loss, -s)
    _close(grad, [[-1.5 * s / 3, -1.5 * s / 3, 0.0]])
    assert _stat(stats, "filtered_fraction") == pytest.approx(1 / 3, abs=1e-6)


# ====================================================================== SAPO


def _sapo(tp=1.0, tn=1.05, **kw):
    return PPOActorConfig(use_sapo_loss=True, sapo_tau_pos=tp, sapo_tau_neg=tn, **kw)


def test_sapo_gate_two_at_ratio_one():
    # g = (4/tau) sigmoid(tau (r - 1)) = 4 * 0.5 = 2 at r = 1, tau = 1; L = -g A = -2.
    loss, stats, grad = _run([[0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]], cfg=_sapo(1.0, 1.05))
    _close(loss, -2.0)
    # gradient at r = 1: -A/N
    _close(grad, [[-1 / 3] * 3])
    assert "sapo_soft_gate" in stats and torch.isfinite(stats["sapo_soft_gate"])


def test_sapo_negative_gate_value():
    # A = -1 at r = 1 with tau_neg = 1.05: g = (4/1.05) * 0.5 = 1.904762, L = +1.904762.
    loss, _, _ = _run([[0.0]], [[-1.0]], cfg=_sapo(1.0, 1.05))
    _close(loss, 2.0 / 1.05)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (2.0, 3.0), (0.5, 0.25)])
def test_sapo_gradient_at_ratio_one_is_minus_a_over_n(taus):
    adv = [[1.0, -2.0, 0.5, 0.0, 3.0]]
    _, _, grad = _run([[0.0] * 5], adv, cfg=_sapo(*taus))
    _close(grad, [[-a / 5 for a in adv[0]]])


def test_sapo_gate_selection_and_gradient_off_ratio_one():
    # tau+ = 1, tau- = 2; tokens (l, A): (.5, 1) (.5, -1) (-.3, 2) (-.3, -.5)
    # g = (4/tau) sig(tau (r - 1)) with tau by sign(A); L = -g A; dL/dlogp = -A 4 sig (1 - sig) r.
    tp, tn = 1.0, 2.0
    ell = [0.5, 0.5, -0.3, -0.3]
    adv = [1.0, -1.0, 2.0, -0.5]
    exp_loss, exp_grad = 0.0, []
    for log_r, a in zip(ell, adv):
        tau = tp if a > 0 else tn
        r = math.exp(log_r)
        s = _sig(tau * (r - 1))
        exp_loss += -(4 / tau) * s * a
        exp_grad.append(-a * 4 * s * (1 - s) * r / 4)
    loss, _, grad = _run([ell], [adv], cfg=_sapo(tp, tn))
    _close(loss, exp_loss / 4)
    _close(grad, [exp_grad])
    # Sanity of the hand numbers for token 0: r = 1.64872, sig(.64872) = .65672, g = 2.62689.
    assert (4 * _sig(math.exp(0.5) - 1)) == pytest.approx(2.62689, abs=1e-4)


def test_sapo_ignores_clipping():
    # r = 2, A = 1, tau+ = 1: g = 4 sig(1) = 2.924234 -> loss -2.924234 (PPO clip would give -1.2).
    for cfg in (_sapo(1.0, 1.05), _sapo(1.0, 1.05, eps_clip=0.2, c_clip=3.0, eps_clip_higher=0.1)):
        loss, stats, _ = _run([[LN(2.0)]], [[1.0]], cfg=cfg)
        _close(loss, -4 * _sig(1.0))
        assert _stat(stats, "clip_fraction") == pytest.approx(0.0, abs=1e-7)


def test_sapo_masked_mean_over_valid_tokens():
    # Valid tokens: (l=0, A=1) -> -2 and (l=0, A=-0.5, tau- = 1.05) -> +0.5 * 4/1.05 * 0.5 = 0.952381
    # loss = (-2 + 0.952381) / 2; masked tokens (A = 100) ignored.
    loss, _, grad = _run(
        [[0.0, 3.0, 0.0, -2.0]], [[1.0, 100.0, -0.5, 100.0]], mask=[[1, 0, 1, 0]], cfg=_sapo(1.0, 1.05)
    )
    _close(loss, (-2.0 + 0.5 * 2.0 / 1.05) / 2)
    _close(grad, [[-1.0 / 2, 0.0, 0.5 / 2, 0.0]])


def test_sapo_sequence_level():
    # Row: valid l = [.2, .4] -> s = e^.3 = 1.349859; valid A = [1, 3] -> Abar = 2 (padded A = 50 excluded)
    # tau+ = 1: g = 4 sig(s - 1); L = -2 g per token; loss = -2 g.
    # grad per valid token = -Abar 4 sig (1 - sig) s / N, N = 2.
    s = math.exp(0.3)
    sg = _sig(s - 1)
    cfg = _sapo(1.0, 1.05, importance_sampling_level="sequence")
    loss, _, grad = _run([[0.2, 0.4, 3.0]], [[1.0, 3.0, 50.0]], mask=[[1, 1, 0]], cfg=cfg)
    _close(loss, -2 * 4 * sg)
    gt = -2 * 4 * sg * (1 - sg) * s / 2
    _close(grad, [[gt, gt, 0.0]])


# ====================================================================== decoupled PPO


def test_decoupled_weight_always_applied():
    # use_decoupled_loss without rejection_sampling: w = exp(old - behave) still applied
    # (docs/algorithms.md#decoupled-loss).
    # old = 0, logp = 0 (r = 1), behave = [-.5, .3, 0, -1] -> w = [e^.5, e^-.3, 1, e]
    # A = [1, 2, -1, .5]: loss = -(e^.5 + 2 e^-.3 - 1 + .5 e) / 4; grad = -A w / 4.
    w = [math.exp(0.5), math.exp(-0.3), 1.0, math.e]
    adv = [1.0, 2.0, -1.0, 0.5]
    cfg = PPOActorConfig(use_decoupled_loss=True)
    loss, stats, grad = _run([[0.0] * 4], [adv], cfg=cfg, behave=[[-0.5, 0.3, 0.0, -1.0]])
    _close(loss, -sum(a * x for a, x in zip(adv, w)) / 4)
    _close(grad, [[-a * x / 4 for a, x in zip(adv, w)]])


def test_decoupled_weight_multiplies_clipped_objective():
    # Token 0: r = 1.5, A = 1 -> clipped -1.2, w = e^.5 -> L = -1.2 e^.5, grad 0.
    # Token 1: r = 1, A = -2, w = e^-.2 (behave .2) -> L = 2 e^-.2, grad = -A w r / N = 2 e^-.2 / 2.
    cfg = PPOActorConfig(use_decoupled_loss=True, eps_clip=0.2)
    loss, _, grad = _run([[LN(1.5), 0.0]], [[1.0, -2.0]], cfg=cfg, behave=[[-0.5, 0.2]])
    _close(loss, (-1.2 * math.exp(0.5) + 2 * math.exp(-0.2)) / 2)
    _close(grad, [[0.0, math.exp(-0.2)]])


def test_decoupled_icepop_rejected_tokens_keep_denominator():
    # IcePop {token, mask, ratio, .5, 5}; old = 0; behave = [0, -2, 1, -ln 2] -> w = [1, 7.39, .368, 2]
    # tokens 1 (7.39 > 5) and 2 (.368 < .5) rejected. logp = [.1, .05, -.1, 0], A = [1, 1, 1, -1].
    # N = 4 (pre-rejection): loss = (-1 * 1 * e^.1 + 0 + 0 + 1 * 2 * 1) / 4
    # grad: token 0 -A w r / N = -e^.1 / 4; token 3 +2/4; rejected tokens 0.
    cfg = PPOActorConfig(
        use_decoupled_loss=True,
        rejection_sampling=dict(level="token", action="mask", metric="ratio", lower=0.5, upper=5.0),
    )
    loss, stats, grad = _run(
        [[0.1, 0.05, -0.1, 0.0]], [[1.0, 1.0, 1.0, -1.0]], cfg=cfg, behave=[[0.0, -2.0, 1.0, -LN(2.0)]]
    )
    _close(loss, (-math.exp(0.1) + 2.0) / 4)
    _close(grad, [[-math.exp(0.1) / 4, 0.0, 0.0, 0.5]])
    assert _stat(stats, "filtered_fraction") == pytest.approx(0.5, abs=1e-6)
    assert "behave_imp_weight" in stats


def test_decoupled_clamp_bounds_weight():
    # {token, clamp, ratio, upper 2}: behave [0, -2] -> w = [1, min(7.39, 2) = 2]; r = 1, A = 1.
    # loss = -(1 + 2)/2
    cfg = PPOActorConfig(
        use_decoupled_loss=True, rejection_sampling=dict(level="token", action="clamp", metric="ratio", upper=2.0)
    )
    loss, _, grad = _run([[0.0, 0.0]], [[1.0, 1.0]], cfg=cfg, behave=[[0.0, -2.0]])
    _close(loss, -1.5)
    _close(grad, [[-0.5, -1.0]])


def test_decoupled_stats_keys():
    cfg = PPOActorConfig(use_decoupled_loss=True)
    _, stats, _ = _run([[0.0, 0.1]], [[1.0, 1.0]], cfg=cfg, behave=[[-0.1, 0.0]])
    for k in ("behave_imp_weight", "filtered_fraction", "clip_fraction", "dual_clip_fraction", "approx_kl",
              "importance_weight_mean"):
        assert k in stats, k
        assert torch.is_tensor(stats[k]) and stats[k].dim() == 0


def test_decoupled_without_behave_logp_raises():
    cfg = PPOActorConfig(use_decoupled_loss=True)
    logp = torch.zeros(1, 3, requires_grad=True)
    with pytest.raises(ValueError):
        policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), cfg)


def test_rejection_without_decoupled_is_ignored():
    # rejection_sampling with use_decoupled_loss=False: warned "ignored" and no weight applied.
    with pytest.warns(UserWarning, match="ignored"):
        cfg = PPOActorConfig(
            use_decoupled_loss=False, rejection_sampling=dict(level="token", action="mask", metric="ratio", upper=2.0)
        )
    # plain PPO: r = [1, 1.1], A = [1, 1] -> loss = -(1 + 1.1)/2
    loss, _, _ = _run([[0.0, LN(1.1)]], [[1.0, 1.0]], cfg=cfg)
    _close(loss, -2.1 / 2)


# ====================================================================== loss_agg_mode


def _agg_case():
    # Row 0: mask [1,1,1,0], A [1,2,3,9]; row 1: mask [1,0,0,0], A [4,...]; row 2: no tokens.
    # r = 1 -> L = -A. |o| = [3, 1, 0], S = 2 rows with tokens.
    ell = [[0.0] * 4] * 3
    adv = [[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0] * 4]
    mask = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    return ell, adv, mask


@pytest.mark.parametrize(
    "mode, num_seqs, expected",
    [
        ("token-mean", None, -(1 + 2 + 3 + 4) / 4),  # -2.5
        ("seq-mean-token-mean", None, (-6 / 3 + -4 / 1) / 2),  # -3
        ("seq-mean-token-sum", None, (-6 - 4) / 2),  # -5
        ("seq-mean-token-sum-norm", None, (-6 - 4) / (2 * 8)),  # -0.625, max_new_tokens 8
        ("seq-mean-token-mean", 4, (-2 - 4) / 4),  # -1.5
        ("seq-mean-token-sum", 4, -10 / 4),
        ("seq-mean-token-sum-norm", 4, -10 / (4 * 8)),
    ],
)
def test_loss_agg_modes(mode, num_seqs, expected):
    ell, adv, mask = _agg_case()
    cfg = PPOActorConfig(loss_agg_mode=mode, max_new_tokens=8)
    loss, _, _ = _run(ell, adv, mask, cfg, num_seqs=num_seqs)
    _close(loss, expected)


def test_seq_mean_token_mean_gradient():
    # d/dlogp_t = -A_t / (|o_i| S): row 0 -[1,2,3]/(3*2), row 1 -4/(1*2).
    ell, adv, mask = _agg_case()
    _, _, grad = _run(ell, adv, mask, PPOActorConfig(loss_agg_mode="seq-mean-token-mean"))
    _close(grad, [[-1 / 6, -2 / 6, -3 / 6, 0.0], [-2.0, 0.0, 0.0, 0.0], [0.0] * 4])


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_seq_modes_micro_batches_with_num_seqs(mode):
    ell, adv, mask, _ = _batch()
    cfg = PPOActorConfig(loss_agg_mode=mode, max_new_tokens=8)
    full, _, full_grad = _run(ell, adv, mask, cfg)
    total, grads = 0.0, []
    for p in (slice(0, 1), slice(1, 4)):
        loss, _, grad = _run(ell[p], adv[p], mask[p], cfg, num_seqs=4)
        total = total + loss.detach()
        grads.append(grad)
    _close(total, full)
    _close(torch.cat(grads), full_grad)


# ====================================================================== entropy


def _entropy_case():
    ent = _t([[0.5, 1.0, 2.0, 9.0], [1.5, 7.0, 7.0, 7.0]])
    mask = [[1, 1, 1, 0], [1, 0, 0, 0]]
    return ent, mask


def test_entropy_stat_and_zero_coef():
    # masked mean entropy = (.5 + 1 + 2 + 1.5) / 4 = 1.25; A = 0 -> loss 0 with entropy_coef 0.
    ent, mask = _entropy_case()
    loss, stats, _ = _run([[0.0] * 4] * 2, [[0.0] * 4] * 2, mask, PPOActorConfig(), entropy=ent)
    _close(loss, 0.0)
    assert _stat(stats, "entropy") == pytest.approx(1.25, abs=1e-6)


def test_entropy_coef_token_mean():
    # loss = (sum L - coef sum H) / N = (-1 - 0.1 * 5) / 4 with A = [[1,0,0,0],[0,...]]
    ent, mask = _entropy_case()
    adv = [[1.0, 0.0, 0.0, 0.0], [0.0] * 4]
    loss, _, grad = _run([[0.0] * 4] * 2, adv, mask, PPOActorConfig(entropy_coef=0.1), entropy=ent)
    _close(loss, (-1.0 - 0.5) / 4)
    _close(grad, [[-0.25, 0.0, 0.0, 0.0], [0.0] * 4])


def test_entropy_coef_seq_mean_token_mean():
    # entropy aggregated like the loss: ((3.5/3) + 1.5/1) / 2 = 1.333333; loss = -0.1 * 1.333333.
    ent, mask = _entropy_case()
    cfg = PPOActorConfig(entropy_coef=0.1, loss_agg_mode="seq-mean-token-mean")
    loss, _, _ = _run([[0.0] * 4] * 2, [[0.0] * 4] * 2, mask, cfg, entropy=ent)
    _close(loss, -0.1 * (3.5 / 3 + 1.5) / 2)


def test_no_entropy_stat_without_entropy():
    _, stats, _ = _run([[0.0]], [[1.0]])
    assert "entropy" not in stats


# ====================================================================== all masked / misc


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(importance_sampling_level="sequence"),
        dict(use_sapo_loss=True),
        dict(use_decoupled_loss=True),
        dict(use_decoupled_loss=True, rejection_sampling=dict(upper=5.0, lower=0.5)),
        dict(loss_agg_mode="seq-mean-token-mean"),
        dict(loss_agg_mode="seq-mean-token-sum-norm"),
    ],
)
def test_all_masked_loss_zero_finite_gradient(kw):
    cfg = PPOActorConfig(**kw)
    beh = [[0.3, -5.0, 2.0]] * 2 if cfg.use_decoupled_loss else None
    loss, stats, grad = _run([[0.5, 3.0, -4.0]] * 2, [[1.0, -2.0, 5.0]] * 2, [[0, 0, 0]] * 2, cfg, behave=beh)
    _close(loss, 0.0)
    assert grad is not None
    _close(grad, torch.zeros(2, 3))
    for k, v in stats.items():
        assert torch.isfinite(v).all(), k


def test_stats_are_detached_0d():
    _, stats, _ = _run([[0.1, -0.1]], [[1.0, -1.0]])
    for k in ("clip_fraction", "dual_clip_fraction", "approx_kl", "importance_weight_mean"):
        assert k in stats, k
        assert stats[k].dim() == 0 and not stats[k].requires_grad, k


def test_sapo_stats_keys():
    _, stats, _ = _run([[0.1, -0.1]], [[1.0, -1.0]], cfg=_sapo())
    assert "sapo_soft_gate" in stats
    assert stats["sapo_soft_gate"].dim() == 0


# ====================================================================== value loss


def _vl(v, old, ret, mask, eps=0.5, **kw):
    values = _t(v).requires_grad_(True)
    loss, stats = value_loss(values, _t(old), _t(ret), _t(mask, torch.bool), eps_clip=eps, **kw)
    assert loss.dim() == 0
    loss.backward()
    return loss, stats, values.grad


def test_value_loss_hand_values_and_gradient():
    # eps = .5, v_clip = old + clamp(v - old, -.5, .5), l = max(.5 (v - G)^2, .5 (v_clip - G)^2)
    #  v=1,   old=0, G=2:  v_clip .5;  .5 vs 1.125 -> 1.125 (clipped branch, grad 0)
    #  v=1,   old=0, G=0:  v_clip .5;  .5 vs .125  -> .5    (grad v - G = 1)
    #  v=.2,  old=0, G=1:  v_clip .2;  .32 = .32   -> .32   (grad -.8; not clipped)
    #  v=-1,  old=0, G=-3: v_clip -.5; 2 vs 3.125  -> 3.125 (grad 0)
    #  masked v=100
    # loss = (1.125 + .5 + .32 + 3.125) / 4 = 5.07 / 4; clip fraction 2/4
    loss, stats, grad = _vl(
        [[1.0, 1.0, 0.2, -1.0, 100.0]], [[0.0] * 5], [[2.0, 0.0, 1.0, -3.0, 0.0]], [[1, 1, 1, 1, 0]]
    )
    _close(loss, 5.07 / 4)
    _close(grad, [[0.0, 0.25, -0.2, 0.0, 0.0]])
    assert _stat(stats, "clip_fraction") == pytest.approx(0.5, abs=1e-6)


def test_value_loss_nonzero_old_values():
    # old = 2, eps = .5, v = 3.5, G = 1: v_clip = 2.5; .5 * 2.5^2 = 3.125 vs .5 * 1.5^2 = 1.125
    #   -> 3.125, unclipped branch active although v left the band: grad v - G = 2.5.
    # old = 2, v = 1.9, G = 4: v_clip 1.9 (in band); .5 * 2.1^2 = 2.205; grad -2.1.
    # old = -1, v = 0, G = 2: v_clip -.5; .5*4 = 2 vs .5*6.25 = 3.125 -> 3.125, grad 0.
    loss, stats, grad = _vl([[3.5, 1.9, 0.0]], [[2.0, 2.0, -1.0]], [[1.0, 4.0, 2.0]], [[1, 1, 1]])
    _close(loss, (3.125 + 2.205 + 3.125) / 3)
    _close(grad, [[2.5 / 3, -2.1 / 3, 0.0]])
    assert _stat(stats, "clip_fraction") == pytest.approx(1 / 3, abs=1e-6)


def test_value_loss_num_tokens():
    loss, _, grad = _vl(
        [[1.0, 1.0, 0.2, -1.0, 100.0]], [[0.0] * 5], [[2.0, 0.0, 1.0, -3.0, 0.0]], [[1, 1, 1, 1, 0]], num_tokens=10
    )
    _close(loss, 5.07 / 10)
    _close(grad, [[0.0, 0.1, -0.08, 0.0, 0.0]])


def test_value_loss_micro_batches_sum():
    v = [[1.0, 0.3, -0.2], [0.7, 2.0, 0.1]]
    old = [[0.0, 0.5, 0.0], [1.0, 0.0, 0.0]]
    ret = [[2.0, 0.0, 0.5], [0.0, 1.0, -1.0]]
    mask = [[1, 1, 0], [1, 1, 1]]
    full, _, full_grad = _vl(v, old, ret, mask)
    l0, _, g0 = _vl(v[:1], old[:1], ret[:1], mask[:1], num_tokens=5)
    l1, _, g1 = _vl(v[1:], old[1:], ret[1:], mask[1:], num_tokens=5)
    _close(l0 + l1, full)
    _close(torch.cat([g0, g1]), full_grad)


def test_value_loss_all_masked():
    loss, stats, grad = _vl([[1.0, 5.0]], [[0.0, 0.0]], [[3.0, -3.0]], [[0, 0]])
    _close(loss, 0.0)
    assert grad is not None and torch.isfinite(grad).all()
    _close(grad, torch.zeros(1, 2))
    assert torch.isfinite(stats["clip_fraction"])


# ====================================================================== CISPO


ELL = [-2.0, -0.5, 0.0, 0.3, 1.5, 0.1]  # log r of six tokens, the last masked
ADV = [1.0, -2.0, 0.5, 3.0, -1.0, 2.0]
MASK = [True, True, True, True, True, False]


def cispo(eps_lo: float, eps_hi: float, **kw) -> PPOActorConfig:
    return PPOActorConfig(policy_loss="cispo", eps_clip=eps_lo, eps_clip_higher=eps_hi, **kw)


@pytest.mark.parametrize("eps_lo, eps_hi", [(0.2, 0.28), (1.0, 4.0)])
def test_cispo_loss_and_gradient_are_the_clipped_detached_weight_times_the_policy_gradient(eps_lo, eps_hi):
    # r_hat = clip(e^ell, 1 - eps_lo, 1 + eps_hi), detached; L = -sum r_hat A ell / 5; dL/dlogp = -r_hat A / 5.
    r_hat = [min(max(math.exp(x), 1 - eps_lo), 1 + eps_hi) for x in ELL]
    loss, stats, grad = _run([ELL], [ADV], mask=[MASK], cfg=cispo(eps_lo, eps_hi))
    _close(loss, -sum(r * a * x for r, a, x, m in zip(r_hat, ADV, ELL, MASK) if m) / 5)
    _close(grad, [[-r * a / 5 if m else 0.0 for r, a, m in zip(r_hat, ADV, MASK)]])
    left = [abs(r - math.exp(x)) > 1e-9 for r, x in zip(r_hat, ELL)]
    assert _stat(stats, "clip_fraction") == pytest.approx(sum(c for c, m in zip(left, MASK) if m) / 5)
    assert _stat(stats, "dual_clip_fraction") == 0.0


def test_cispo_gradient_reaches_no_old_log_prob_and_clipped_tokens_keep_theirs():
    # r = e^2 far above the band: PPO would give this token no gradient, CISPO gives -(1 + eps_hi) A / N.
    logp = _t([[2.0, 0.0]]).requires_grad_(True)
    old = _t([[0.0, 0.0]]).requires_grad_(True)
    loss, _ = policy_loss(logp, old, _t([[1.0, 1.0]]), _t([[True, True]], torch.bool), cispo(0.2, 0.28))
    loss.backward()
    _close(logp.grad, [[-1.28 / 2, -1.0 / 2]])
    assert old.grad is None or torch.count_nonzero(old.grad) == 0


def test_cispo_with_the_decoupled_loss_weights_each_token_by_pi_prox_over_pi_behave():
    # old (prox) = 0, behave = [-.5, .3]: w = [e^.5, e^-.3]; r = [e^.1, e^-.1] in band (1, 4).
    cfg = cispo(1.0, 4.0, use_decoupled_loss=True)
    ell, adv, w = [0.1, -0.1], [1.0, -2.0], [math.exp(0.5), math.exp(-0.3)]
    loss, _, grad = _run([ell], [adv], cfg=cfg, behave=[[-0.5, 0.3]])
    _close(loss, -sum(math.exp(x) * a * x * v for x, a, v in zip(ell, adv, w)) / 2)
    _close(grad, [[-math.exp(x) * a * v / 2 for x, a, v in zip(ell, adv, w)]])


# ====================================================================== DPPO trust-region mask


def bern_kl(mu: float, p: float) -> float:
    return mu * math.log(mu / p) + (1 - mu) * math.log((1 - mu) / (1 - p))


# (pi_old, pi_theta, A) of five tokens: a rare token tripled, a likely one nudged up, one up by 0.2, one down by
# 0.2 with A < 0, one down by 0.2 with A > 0 (the direction the advantage does not push: never masked).
TOKENS = [(0.01, 0.03, 1.0), (0.9, 0.99, 1.0), (0.5, 0.7, 1.0), (0.3, 0.1, -1.0), (0.3, 0.1, 1.0)]


@pytest.mark.parametrize("divergence, bound, kept", [
    ("binary_tv", 0.15, [True, True, False, False, True]),  # |p - mu| = .02, .09, .2, .2, .2
    ("binary_kl", 0.05, [True, False, False, False, True]),  # KL = .0092, .1445, .0872, .1537, .1537
])
def test_trust_region_mask_drops_tokens_that_moved_past_the_bound_the_way_their_advantage_pushes(divergence, bound,
                                                                                                  kept):
    assert [round(abs(p - mu), 4) for mu, p, _ in TOKENS] == [0.02, 0.09, 0.2, 0.2, 0.2]
    assert [round(bern_kl(mu, p), 4) for mu, p, _ in TOKENS] == [0.0092, 0.1445, 0.0872, 0.1537, 0.1537]
    # DPPO's loss: REINFORCE with the ratio truncated at C = 20 (cispo with eps 1 / 19): L = -r A log r.
    cfg = cispo(1.0, 19.0, trust_region_mask={"divergence": divergence, "low": bound, "high": bound})
    adv = [a for _, _, a in TOKENS]
    loss, stats, grad = _run([[math.log(p) for _, p, _ in TOKENS]], [adv], cfg=cfg,
                             old=[[math.log(mu) for mu, _, _ in TOKENS]])
    r = [p / mu for mu, p, _ in TOKENS]
    _close(loss, -sum(x * a * math.log(x) for x, a, k in zip(r, adv, kept) if k) / 5)  # masked tokens stay in N
    _close(grad, [[-x * a / 5 if k else 0.0 for x, a, k in zip(r, adv, kept)]])
    assert _stat(stats, "trust_region_masked_fraction") == pytest.approx(kept.count(False) / 5)


def test_trust_region_mask_settings_are_checked():
    with pytest.raises(ValueError, match=r"^trust_region_mask.divergence='tv' is invalid: must be one of 'binary_tv', "
                                         r"'binary_kl'$"):
        PPOActorConfig(trust_region_mask={"divergence": "tv"})
    with pytest.raises(ValueError, match=r"^trust_region_mask.high=0 is invalid"):
        PPOActorConfig(trust_region_mask={"high": 0})


# ====================================================================== high-entropy tokens (80/20)


def test_only_the_top_entropy_fraction_keeps_its_loss_and_every_token_counts_in_n():
    # Entropies [.01, .02, .5, 1.2, 2.0]: the 0.8 quantile interpolates 1.2 + .2 * .8 = 1.36, so only the last
    # token (2.0) keeps its loss; r = 1 (PPO: L = -A), N = 5.
    entropy = _t([[0.01, 0.02, 0.5, 1.2, 2.0]])
    adv = [1.0, -2.0, 0.5, 3.0, -1.5]
    loss, stats, grad = _run([[0.0] * 5], [adv], cfg=PPOActorConfig(top_entropy_quantile=0.2), entropy=entropy)
    _close(loss, 1.5 / 5)
    _close(grad, [[0.0, 0.0, 0.0, 0.0, 1.5 / 5]])
    assert _stat(stats, "low_entropy_masked_fraction") == pytest.approx(0.8)
    # Masked tokens do not set the threshold: with the last masked, 1.2 is the top of four.
    loss, _, grad = _run([[0.0] * 5], [adv], mask=[[True, True, True, True, False]],
                         cfg=PPOActorConfig(top_entropy_quantile=0.2), entropy=entropy)
    _close(grad, [[0.0, 0.0, 0.0, -3.0 / 4, 0.0]])
    with pytest.raises(ValueError, match=r"^top_entropy_quantile=0 is invalid"):
        PPOActorConfig(top_entropy_quantile=0)


# ====================================================================== GMPO


def gmpo(**kw) -> PPOActorConfig:
    return PPOActorConfig(policy_loss="gmpo", importance_sampling_level="sequence", eps_clip=0.4, eps_clip_higher=0.4,
                          loss_agg_mode="seq-mean-token-mean", **kw)


@pytest.mark.parametrize("a, clipped, grad_mask", [
    (1.0, [0.4, -0.1, 0.0], [0.0, 1.0, 1.0]),  # A > 0: log r capped at 0.4, the capped token gets no gradient
    (-1.0, [0.5, -0.1, 0.0], [1.0, 1.0, 1.0]),  # A < 0: only a floor at -0.4, not reached
])
def test_gmpo_geometric_mean_of_the_token_clipped_ratios_times_the_advantage(a, clipped, grad_mask):
    # rho = exp(mean clipped log r); L = -A rho (one sequence); dL/dlogp_t = -A rho / 3 where unclipped.
    rho = math.exp(sum(clipped) / 3)
    loss, stats, grad = _run([[0.5, -0.1, 0.0]], [[a] * 3], cfg=gmpo())
    _close(loss, -a * rho)
    _close(grad, [[-a * rho / 3 * g for g in grad_mask]])
    assert _stat(stats, "clip_fraction") == 0.0


def test_gmpo_floors_a_falling_token_of_negative_advantage_and_averages_sequences():
    # Row 0: log r [-0.6, 0] with A = -1 -> [-0.4, 0], rho0 = e^-0.2; row 1: [0.2] with A = 2, rho1 = e^0.2.
    # L = (-(-1) rho0 - 2 rho1) / 2; grads: row 0 token 0 clipped (0), token 1 rho0 / 2 / 2; row 1 -2 rho1 / 2.
    rho0, rho1 = math.exp(-0.2), math.exp(0.2)
    loss, _, grad = _run([[-0.6, 0.0], [0.2, 0.0]], [[-1.0, -1.0], [2.0, 2.0]], mask=[[True, True], [True, False]],
                         cfg=gmpo())
    _close(loss, (rho0 - 2 * rho1) / 2)
    _close(grad, [[0.0, rho0 / 4], [-2 * rho1 / 2, 0.0]])


# ====================================================================== M2PO


def test_m2po_masks_the_largest_second_moments_until_the_rest_average_below_the_threshold():
    # behave - prox = [.5, .3, .1, .05, 0]: m2 sorted [.25, .09, .01, .0025, 0]; suffix means .0705 (>= .04),
    # then .0256 (< .04): only the .25 token is dropped. r = 1, w = exp(prox - behave) = e^delta, unclipped:
    # L = -sum_kept w A / 5 (every token in N).
    delta = [0.5, 0.3, 0.1, 0.05, 0.0]
    adv = [1.0, -1.0, 2.0, 0.5, -0.5]
    cfg = PPOActorConfig(use_decoupled_loss=True, m2_threshold=0.04, policy_loss="unclipped")
    loss, stats, grad = _run([[0.0] * 5], [adv], cfg=cfg, behave=[[-d for d in delta]])
    kept = [False, True, True, True, True]
    _close(loss, -sum(math.exp(d) * a for d, a, k in zip(delta, adv, kept) if k) / 5)
    _close(grad, [[-math.exp(d) * a / 5 if k else 0.0 for d, a, k in zip(delta, adv, kept)]])
    assert _stat(stats, "m2po_masked_fraction") == pytest.approx(0.2)


def test_m2po_keeps_the_smallest_token_when_no_suffix_is_below_the_threshold():
    cfg = PPOActorConfig(use_decoupled_loss=True, m2_threshold=0.04, policy_loss="unclipped")
    _, stats, grad = _run([[0.0] * 3], [[1.0] * 3], cfg=cfg, behave=[[-1.0, -0.9, 0.8]])  # m2 1, .81, .64
    _close(grad, [[0.0, 0.0, -math.exp(-0.8) / 3]])
    assert _stat(stats, "m2po_masked_fraction") == pytest.approx(2 / 3)


def test_m2po_needs_the_decoupled_loss():
    with pytest.raises(ValueError, match=r"^m2_threshold=0.04 is invalid: must be null without use_decoupled_loss"):
        PPOActorConfig(m2_threshold=0.04)


# ====================================================================== GPG


def test_gpg_is_the_plain_policy_gradient_at_any_ratio():
    # L = -sum A log r / N; dL/dlogp = -A / N whatever r (no ratio weight, no clip).
    ell, adv = [1.5, -2.0, 0.1], [1.0, -0.5, 2.0]
    loss, stats, grad = _run([ell], [adv], cfg=PPOActorConfig(policy_loss="gpg"))
    _close(loss, -sum(a * x for a, x in zip(adv, ell)) / 3)
    _close(grad, [[-a / 3 for a in adv]])
    assert _stat(stats, "clip_fraction") == 0.0


# ====================================================================== Clip-Cov and KL-Cov

# A = [1, 1, -1, -1], log pi_theta = [-.1, -2, -.2, -3] (old 0): means 0 and -1.325, so
# Cov = [1.225, -.675, -1.125, 1.675]. Only tokens 0 and 3 lie in (1, 5); token 3 (r = e^-3, A < 0) is clipped.
COV_LOGP, COV_ADV = [-0.1, -2.0, -0.2, -3.0], [1.0, 1.0, -1.0, -1.0]


def test_clip_cov_drops_the_gradient_of_unclipped_tokens_of_high_covariance():
    # One token of four (floor(0.0002 * 4) -> at least 1) among the candidates: token 0 alone (3 is clipped).
    # PPO clip 0.2: L = [0 (dropped), -e^-2, e^-.2, -(-1) * 0.8] / 4; grads [0, -e^-2, e^-.2, 0] / 4.
    r = [math.exp(x) for x in COV_LOGP]
    loss, stats, grad = _run([COV_LOGP], [COV_ADV], cfg=PPOActorConfig(clip_cov={}))
    _close(loss, (-r[1] + r[2] + 0.8) / 4)
    _close(grad, [[0.0, -r[1] / 4, r[2] / 4, 0.0]])
    assert _stat(stats, "clip_cov_fraction") == pytest.approx(0.25)
    # Without a candidate nothing is dropped.
    loss, stats, _ = _run([COV_LOGP], [COV_ADV], cfg=PPOActorConfig(clip_cov={"low": 2.0, "high": 5.0}))
    _close(loss, (-r[0] - r[1] + r[2] + 0.8) / 4)
    assert _stat(stats, "clip_cov_fraction") == 0.0


def test_kl_cov_penalises_how_far_the_tokens_of_highest_covariance_moved():
    # Unclipped -A r; the top floor(0.5 * 4) = 2 by covariance (tokens 3 and 0) add 1 * |log r|.
    r = [math.exp(x) for x in COV_LOGP]
    cfg = PPOActorConfig(policy_loss="unclipped", kl_cov={"ratio": 0.5, "coef": 1.0})
    loss, stats, grad = _run([COV_LOGP], [COV_ADV], cfg=cfg)
    chosen = [True, False, False, True]
    _close(loss, sum(-a * x + (abs(lp) if c else 0.0) for a, x, lp, c in zip(COV_ADV, r, COV_LOGP, chosen)) / 4)
    _close(grad, [[(-a * x - (1.0 if c else 0.0)) / 4 for a, x, c in zip(COV_ADV, r, chosen)]])
    assert _stat(stats, "kl_cov_fraction") == pytest.approx(0.5)


def test_cov_settings_are_checked():
    with pytest.raises(ValueError, match=r"^clip_cov.low=5.0 is invalid: must be < high \(5.0\)$"):
        PPOActorConfig(clip_cov={"low": 5.0})
    with pytest.raises(ValueError, match=r"^kl_cov.coef=0 is invalid"):
        PPOActorConfig(kl_cov={"coef": 0})


# ====================================================================== KL term in the loss


@pytest.mark.parametrize("estimator, value, slope", [
    ("k3", lambda d: math.exp(-d) - 1 + d, lambda d: 1 - math.exp(-d)),
    ("k2", lambda d: d * d / 2, lambda d: d),
    ("k1", lambda d: d, lambda d: 1.0),
])
def test_kl_loss_term_is_beta_times_the_estimate_with_its_gradient(estimator, value, slope):
    # A = 0 (the surrogate adds nothing); logp - ref = [.2, -.1]; L = beta * mean K; dL/dlogp = beta K'(d) / 2.
    beta, d = 0.5, [0.2, -0.1]
    cfg = PPOActorConfig(kl_loss_coef=beta, kl_loss_estimator=estimator)
    loss, stats, grad = _run([d], [[0.0, 0.0]], cfg=cfg, ref_logp=_t([[0.0, 0.0]]))
    _close(loss, beta * (value(d[0]) + value(d[1])) / 2)
    _close(grad, [[beta * slope(x) / 2 for x in d]])
    assert _stat(stats, "kl_loss") == pytest.approx((value(d[0]) + value(d[1])) / 2, rel=1e-5)


def test_kl_loss_needs_the_reference_log_probs():
    with pytest.raises(ValueError, match="kl_loss_coef > 0 needs ref_logp"):
        _run([[0.0]], [[1.0]], cfg=PPOActorConfig(kl_loss_coef=0.1))


# ====================================================================== statistics over the tokens that count

# Two rows, the second with one pad. log r = logp - old_logp, A the advantages; each narrowing mask below drops
# the tokens its rule drops on these numbers (worked in its comment). A statistic of the surrogate is its mean over
# the tokens kept: at the sequence level each kept token carries its row's s_b = exp(mean of the kept log r) and
# mean kept advantage; a dropped token's ratio (0 there) must not enter any mean.
STAT_OLD = [[-0.5, -1.0, -2.0, -1.5], [-0.3, -0.7, -0.2, 0.0]]
STAT_LOG_R = [[0.3, -0.4, 0.05, 1.2], [-0.1, 0.25, -1.5, 0.0]]
STAT_ADV = [[1.0, -1.0, 0.5, -2.0], [-0.5, 1.5, -1.0, 0.0]]
STAT_MASK = [[True, True, True, True], [True, True, True, False]]
NO_GAP = [[0.0] * 4, [0.0] * 4]
# name: (config fields, prox - behave per token (None: not decoupled), entropy, tokens kept)
NARROWING_MASKS = {
    "none": ({}, None, None, STAT_MASK),
    # w = exp(gap): e^2 > 5 and e^-1 < 0.5 leave IcePop's band [0.5, 5].
    "rejection_token": ({"use_decoupled_loss": True, "rejection_sampling": {"lower": 0.5, "upper": 5.0}},
                        [[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]], None,
                        [[True, False, True, True], [True, True, False, False]]),
    # Row means of the gap .001 (e^.001 in [.99, 1.01], kept) and .1 / 3 (e^.033, the row dropped).
    "rejection_sequence": ({"use_decoupled_loss": True, "rejection_sampling": {
        "level": "sequence", "metric": "ratio", "agg": "mean", "lower": 0.99, "upper": 1.01}},
        [[0.004, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]], None,
        [[True, True, True, True], [False, False, False, False]]),
    # m2 = gap^2 = [.36, .01, 0 x 5]: the mean of all 7 is .053 >= .04, without the largest .0017: one dropped.
    "m2po": ({"use_decoupled_loss": True, "m2_threshold": 0.04}, [[-0.6, 0.0, 0.0, 0.0], [0.0, -0.1, 0.0, 0.0]],
             None, [[False, True, True, True], [True, True, True, False]]),
    # p = exp(old + log r): row 0 token 0 rose .212 with A > 0, row 1 token 2 fell .636 with A < 0 (bound .15).
    "trust_region": ({"trust_region_mask": {}}, None, None, [[False, True, True, True], [True, True, False, False]]),
    # The median entropy of the 7 tokens is .55: the tokens at or above it keep their loss.
    "entropy_quantile": ({"top_entropy_quantile": 0.5}, None, [[0.1, 0.9, 0.3, 0.7], [0.55, 0.2, 0.8, 0.0]],
                         [[False, True, False, True], [True, False, True, False]]),
}


def surrogate_inputs(level: str, kept: list[list[bool]]) -> list[tuple[float, float]]:
    """(r, A) of every kept token: the token's own, or at the sequence level its row's over the kept tokens."""
    out = []
    for log_r, adv, keep in zip(STAT_LOG_R, STAT_ADV, kept):
        pairs = [(lr, a) for lr, a, k in zip(log_r, adv, keep) if k]
        if level == "sequence" and pairs:
            s = math.exp(sum(lr for lr, _ in pairs) / len(pairs))
            out += [(s, sum(a for _, a in pairs) / len(pairs))] * len(pairs)
        else:
            out += [(math.exp(lr), a) for lr, a in pairs]
    return out


def ppo_flags(r: float, a: float, eps: float = 0.2, c: float = 3.0) -> tuple[bool, bool]:
    """(clip, dual clip) of one token: the clipped branch strictly above the unclipped, then L above c |A|."""
    unclipped, clipped = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
    return unclipped < clipped, max(unclipped, clipped) > c * abs(a)


def sapo_gate(r: float, a: float) -> float:
    tau = 1.0 if a > 0 else 1.05
    return 4 / tau * _sig(tau * (r - 1))


STATISTICS = {
    "importance_weight_mean": lambda r, a: r,
    "approx_kl": lambda r, a: r - 1 - math.log(r),
    "clip_fraction": lambda r, a: float(ppo_flags(r, a)[0]),
    "dual_clip_fraction": lambda r, a: float(ppo_flags(r, a)[1]),
}


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mask_name", list(NARROWING_MASKS))
@pytest.mark.parametrize("statistic", list(STATISTICS))
def test_every_ratio_statistic_is_its_mean_over_the_tokens_that_count(statistic, mask_name, level):
    fields, gap, entropy, kept = NARROWING_MASKS[mask_name]
    logp = [[o + lr for o, lr in zip(old, log_r)] for old, log_r in zip(STAT_OLD, STAT_LOG_R)]
    behave = None if gap is None else [[o - g for o, g in zip(old, gaps)] for old, gaps in zip(STAT_OLD, gap)]
    cfg = PPOActorConfig(importance_sampling_level=level, c_clip=3.0, **fields)
    extra = {} if entropy is None else {"entropy": _t(entropy)}
    _, stats, _ = _run(logp, STAT_ADV, mask=STAT_MASK, cfg=cfg, behave=behave, old=STAT_OLD, **extra)
    tokens = surrogate_inputs(level, kept)
    expected = sum(STATISTICS[statistic](r, a) for r, a in tokens) / len(tokens)
    assert _stat(stats, statistic) == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mask_name", ["none", "trust_region", "entropy_quantile"])  # SAPO takes no decoupled loss
def test_the_sapo_gate_is_its_mean_over_the_tokens_that_count(mask_name, level):
    fields, _, entropy, kept = NARROWING_MASKS[mask_name]
    logp = [[o + lr for o, lr in zip(old, log_r)] for old, log_r in zip(STAT_OLD, STAT_LOG_R)]
    cfg = PPOActorConfig(importance_sampling_level=level, policy_loss="sapo", **fields)
    extra = {} if entropy is None else {"entropy": _t(entropy)}
    _, stats, _ = _run(logp, STAT_ADV, mask=STAT_MASK, cfg=cfg, old=STAT_OLD, **extra)
    tokens = surrogate_inputs(level, kept)
    for statistic, value in (("sapo_soft_gate", sapo_gate), ("importance_weight_mean", lambda r, a: r),
                             ("approx_kl", lambda r, a: r - 1 - math.log(r))):
        expected = sum(value(r, a) for r, a in tokens) / len(tokens)
        assert _stat(stats, statistic) == pytest.approx(expected, rel=1e-5, abs=1e-6), statistic


def test_an_on_policy_row_logs_no_policy_change_under_a_mask_at_the_sequence_level():
    # The example of the report: 4 on-policy tokens, the 2 of lowest entropy masked. r = 1 on the kept tokens, so
    # approx_kl is 0 and the mean ratio 1 (the dropped tokens' ratio of 0 used to count: approx_kl 34).
    cfg = PPOActorConfig(importance_sampling_level="sequence", top_entropy_quantile=0.5)
    _, stats, _ = _run([[0.0] * 4], [[1.0] * 4], cfg=cfg, entropy=_t([[0.1, 0.2, 0.3, 0.4]]))
    assert _stat(stats, "approx_kl") == pytest.approx(0.0, abs=1e-7)
    assert _stat(stats, "importance_weight_mean") == pytest.approx(1.0, abs=1e-7)
    assert _stat(stats, "low_entropy_masked_fraction") == pytest.approx(0.5)


# ====================================================================== on-policy distillation beside AReaL and verl

# opd's advantage is fixed when the batch is scored: A_t = teacher_t - old_t (kl_ctl 1, k1), under the PPO clip 0.2.
# AReaL's pure distillation (rl_loss_weight 0, areal/trainer/ppo/actor.py) takes
# -kappa * sum_t r_t (teacher_t - sg(logp_t)) / N, no clip; verl's policy-gradient distillation
# (verl/trainer/distillation/losses.py, distillation_loss with use_policy_gradient and loss_mode k1) takes the
# advantage teacher_t - sg(logp_t) into its vanilla PPO loss (clip 0.2, dual clip 3). Both read the current log-prob.
OPD_TEACHER_MINUS_OLD = [0.5, -1.0, 2.0, -0.3, 0.8]


def areal_pure_kd_grad(log_r: list[float], kappa: float = 1.0) -> list[float]:
    """d/dlogp of -kappa * sum_t exp(logp_t - old_t) (T_t - sg logp_t) / N, with T_t - logp_t = A_t - log r_t."""
    n = len(log_r)
    return [-kappa * math.exp(lr) * (a - lr) / n for a, lr in zip(OPD_TEACHER_MINUS_OLD, log_r)]


def verl_pg_distill_grad(log_r: list[float], eps: float = 0.2, c: float = 3.0) -> list[float]:
    """d/dlogp of verl's vanilla PPO loss with advantage A'_t = T_t - sg logp_t: -A' r / N on the unclipped branch."""
    n, out = len(log_r), []
    for a, lr in zip(OPD_TEACHER_MINUS_OLD, log_r):
        adv, r = a - lr, math.exp(lr)
        clipped, dual = ppo_flags(r, adv, eps, c)
        out.append(0.0 if clipped or dual else -adv * r / n)
    return out


def test_opd_matches_areal_and_verl_on_the_first_minibatch_and_differs_by_log_r_after_it():
    cfg = PPOActorConfig(kl_ctl=1.0, kl_estimator="k1", reward_scaling=0.0, discount=0.0, reward_norm=None,
                         adv_norm=None)
    adv = [OPD_TEACHER_MINUS_OLD]
    # First minibatch: logp = old (r = 1), so teacher - old = teacher - logp: the three gradients agree.
    _, _, grad = _run([[0.0] * 5], adv, cfg=cfg)
    _close(grad, [areal_pure_kd_grad([0.0] * 5)])
    _close(grad, [verl_pg_distill_grad([0.0] * 5)])
    # After it: the peers' advantage is lit_ppo's minus log r_t. Tokens 0, 1, 3 and 4 are unclipped everywhere (lit_ppo
    # -A r / N, the peers -(A - log r) r / N: the peers' gradient is lit_ppo's plus r log r / N); token 2 (A = 2,
    # r = e^0.3 > 1.2) is clipped by lit_ppo and verl alike, and AReaL, unclipped, still pushes it.
    log_r = [0.1, -0.15, 0.3, 0.05, -0.3]
    _, _, grad = _run([log_r], adv, cfg=cfg)
    ours = grad[0].tolist()
    areal, verl = areal_pure_kd_grad(log_r), verl_pg_distill_grad(log_r)
    for t in (0, 1, 3, 4):
        r = math.exp(log_r[t])
        assert areal[t] - ours[t] == pytest.approx(r * log_r[t] / 5, rel=1e-4)
        assert verl[t] - ours[t] == pytest.approx(r * log_r[t] / 5, rel=1e-4)
    assert ours[2] == verl[2] == 0.0 and areal[2] == pytest.approx(-math.exp(0.3) * 1.7 / 5)


# ====================================================================== beside verl and TRL
# (docs/algorithms.md#lit_ppo-beside-verl-and-trl-loss-by-loss)

# Two rows of 3 and 2 tokens: log r and A chosen so that every branch of the clip is taken somewhere.
PEER_LOG_R = [[0.3, -0.4, 0.05], [1.2, -0.1, 0.0]]
PEER_ADV = [[1.0, -1.0, 0.5], [-2.0, 0.7, 0.0]]
PEER_MASK = [[True, True, True], [True, True, False]]


def peer_rows() -> list[list[tuple[float, float]]]:
    """(log r, A) of each row's tokens."""
    return [[(lr, a) for lr, a, m in zip(*row) if m] for row in zip(PEER_LOG_R, PEER_ADV, PEER_MASK)]


def trl_grpo_token_loss(lr: float, a: float, eps_low: float = 0.2, eps_high: float = 0.2) -> float:
    """TRL's GRPOTrainer._compute_loss, loss_type 'grpo' / 'dapo':
    -min(coef_1 A, clamp(coef_1, 1 - eps, 1 + eps_high) A)."""
    r = math.exp(lr)
    return -min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)


def verl_vanilla_token_loss(lr: float, a: float, c: float = 3.0) -> float:
    """verl's compute_policy_loss_vanilla: the clipped loss, and for A < 0 at most -A * clip_ratio_c (default 3)."""
    clipped = trl_grpo_token_loss(max(min(lr, 20.0), -20.0), a)
    return min(clipped, -a * c) if a < 0 else clipped


@pytest.mark.parametrize("peer", ["trl", "verl"])
def test_ppo_clip_equals_trls_dapo_loss_and_verls_vanilla_loss_with_its_dual_clip(peer):
    # TRL's default loss_type 'dapo' and verl's token-mean both divide the summed loss by the token count N = 5.
    tokens = [t for row in peer_rows() for t in row]
    if peer == "trl":
        cfg, expected = PPOActorConfig(), sum(trl_grpo_token_loss(lr, a) for lr, a in tokens) / 5
    else:
        cfg, expected = PPOActorConfig(c_clip=3.0), sum(verl_vanilla_token_loss(lr, a) for lr, a in tokens) / 5
    loss, _, _ = _run(PEER_LOG_R, PEER_ADV, mask=PEER_MASK, cfg=cfg)
    _close(loss, expected)
    # The row of log r 1.2 and A = -2: r = 3.32 > 3, so verl's dual clip binds where TRL's loss does not.
    assert verl_vanilla_token_loss(1.2, -2.0) != trl_grpo_token_loss(1.2, -2.0)


def test_sequence_ratio_equals_trls_sequence_importance_sampling_with_its_grpo_loss():
    # TRL importance_sampling_level='sequence' (loss_type 'grpo', the only clip loss it allows there): coef_1 =
    # exp(mean_t log r) per row, one advantage per row, then the mean over rows of each row's token mean. That is
    # lit_ppo's gspo with loss_agg_mode seq-mean-token-mean, for advantages constant over a row (outcome rewards).
    adv = [[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]]
    rows = [[lr for lr, m in zip(log_r, mask) if m] for log_r, mask in zip(PEER_LOG_R, PEER_MASK)]
    expected = sum(trl_grpo_token_loss(sum(r) / len(r), a[0]) for r, a in zip(rows, adv)) / 2
    cfg = PPOActorConfig(importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean")
    loss, _, grad = _run(PEER_LOG_R, adv, mask=PEER_MASK, cfg=cfg)
    _close(loss, expected)
    # Both rows are unclipped (s_0 = e^-0.0167; s_1 = e^0.55 with A < 0): each token gets -A s_b / |o_b| / 2. verl's
    # loss_mode=gspo (GSPO-token: exp(logp - sg(logp) + sg(log s_b)) on each token) has the same value and gradient.
    s = [math.exp(sum(r) / len(r)) for r in rows]
    _close(grad, [[-1.0 * s[0] / 3 / 2] * 3, [2.0 * s[1] / 2 / 2] * 2 + [0.0]])


def test_sapo_equals_trls_sapo_loss_with_its_sequence_mean():
    # TRL loss_type 'sapo' (sapo_temperature_pos 1.0, _neg 1.05): -4 / tau sigmoid(tau (r - 1)) A, aggregated as its
    # 'grpo' loss: the mean over rows of each row's token mean.
    def gate_loss(lr, a):
        tau = 1.0 if a > 0 else 1.05
        return -4 / tau * _sig(tau * (math.exp(lr) - 1)) * a
    expected = sum(sum(gate_loss(lr, a) for lr, a in row) / len(row) for row in peer_rows()) / 2
    loss, _, _ = _run(PEER_LOG_R, PEER_ADV, mask=PEER_MASK,
                      cfg=PPOActorConfig(policy_loss="sapo", loss_agg_mode="seq-mean-token-mean"))
    _close(loss, expected)


def test_cispo_has_the_gradient_of_trls_cispo_loss():
    # TRL loss_type 'cispo': -sg(min(r, epsilon_high)) A log pi_theta / N (no lower bound); verl loss_mode=cispo the
    # same with sg(clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)). lit_ppo's cispo with eps_clip 1.0 and
    # eps_clip_higher = epsilon_high - 1 has their gradient -min(r, epsilon_high) A / N; the values differ by the
    # constant sum min(r, epsilon_high) A log pi_old / N.
    epsilon_high = 3.0
    tokens = peer_rows()[0] + peer_rows()[1]
    expected = [-min(math.exp(lr), epsilon_high) * a / 5 for lr, a in tokens]
    _, _, grad = _run(PEER_LOG_R, PEER_ADV, mask=PEER_MASK,
                      cfg=PPOActorConfig(policy_loss="cispo", eps_clip=1.0, eps_clip_higher=epsilon_high - 1))
    _close(grad[_t(PEER_MASK, torch.bool)], expected)


@pytest.mark.parametrize("peer", ["trl", "verl"])
def test_kl_loss_term_equals_trls_beta_and_verls_kl_loss(peer):
    # TRL beta: per_token_loss += beta * (exp(ref - logp) - (ref - logp) - 1), before its aggregation; verl
    # use_kl_loss with kl_loss_type low_var_kl: the same k3, clamped to [-10, 10], aggregated as the policy loss.
    # Equal wherever k3 <= 10 (all five tokens here); lit_ppo does not clamp the loss term.
    beta, diffs = 0.04, [0.3, -0.5, 1.0, -2.0, 0.1]
    k3 = [math.exp(-d) + d - 1 for d in diffs]
    logp = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    ref = [[-diffs[0], -diffs[1], -diffs[2]], [-diffs[3], -diffs[4], 0.0]]
    cfg = PPOActorConfig(kl_loss_coef=beta, kl_loss_estimator="k3")
    loss, stats, _ = _run(logp, [[0.0] * 3] * 2, mask=PEER_MASK, cfg=cfg, ref_logp=_t(ref))
    peer_k3 = k3 if peer == "trl" else [min(max(k, -10.0), 10.0) for k in k3]
    _close(loss, beta * sum(peer_k3) / 5)
    # logp - ref = -3: k3 = e^3 - 4 = 16.1, which verl's clamp holds at 10.
    _, stats, _ = _run([[0.0]], [[0.0]], cfg=cfg, ref_logp=_t([[3.0]]))
    assert _stat(stats, "kl_loss") == pytest.approx(math.exp(3) - 4, rel=1e-5)


def test_kl_ref_is_trls_kl_the_k3_to_the_reference_averaged_over_the_generated_tokens():
    """TRL's logged ``kl``: per_token_kl = exp(ref - logp) - (ref - logp) - 1 on the policy being trained, its
    mean over the completion tokens. Padding is left out; a token a mask drops from the loss still counts (the
    high-entropy mask keeps only the last token here), and kl_ref is logged with a reference whatever beta is."""
    logp = [[-0.5, -1.0, -2.0, 0.0]]
    ref = [[-0.7, -0.4, -2.5, -9.0]]
    mask = [[True, True, True, False]]
    cfg = PPOActorConfig(top_entropy_quantile=0.3)
    _, stats, _ = _run(logp, [[1.0, 1.0, 1.0, 0.0]], mask=mask, cfg=cfg, ref_logp=_t(ref),
                       entropy=_t([[0.1, 0.2, 0.3, 0.0]]))
    per_token = [math.exp(r - lp) - (r - lp) - 1 for lp, r in zip(logp[0][:3], ref[0][:3])]
    _close(stats["kl_ref"], sum(per_token) / 3)  # (0.0187 + 0.2221 + 0.1065) / 3
    assert float(stats["kl_ref"]) == pytest.approx(0.115793, abs=1e-6)
    assert float(stats["low_entropy_masked_fraction"]) == pytest.approx(2 / 3)
    _, stats, _ = _run(logp, [[1.0, 1.0, 1.0, 0.0]], mask=mask)
    assert "kl_ref" not in stats  # no reference, no KL to it


def test_each_statistic_comes_with_the_tokens_it_is_a_mean_over():
    """approx_kl is a mean over the tokens whose loss counts, the entropy and a mask's share over the generated
    ones; the loss and the KL term are aggregates, with no count (a micro-batch's is its share)."""
    logp = _t([[-0.5, -1.0, -2.0, 0.0]], torch.float32).requires_grad_(True)
    mask = _t([[True, True, True, False]], torch.bool)
    cfg = PPOActorConfig(top_entropy_quantile=0.3, kl_loss_coef=0.1)
    _, stats = policy_loss(logp, torch.zeros(1, 4), torch.ones(1, 4), mask, cfg, ref_logp=torch.zeros(1, 4),
                           entropy=_t([[0.1, 0.2, 0.3, 0.0]]))
    assert {name: int(count) for name, count in stats.tokens.items()} == {
        "approx_kl": 1, "importance_weight_mean": 1, "clip_fraction": 1, "dual_clip_fraction": 1,
        "entropy": 3, "low_entropy_masked_fraction": 3, "kl_ref": 3}
    assert {"loss", "kl_loss"} <= stats.keys()

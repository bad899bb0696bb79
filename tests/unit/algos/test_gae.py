"""Unit tests for ``lit_ppo.algos.compute_gae`` (docs/algorithms.md#gae,
docs/algorithms.md#the-turn_ids-contract).

Layout is label-aligned (docs/algorithms.md#data-layout). A test named ``caseN`` re-expresses case N
of AReaL's GAE tests (tests/test_ppo_gae.py): their arrays are already shifted, so they are used as
label-aligned arrays directly; "no_eos True" becomes bootstrap = V[S-1] of that row. Differences
from AReaL that these tests follow: inactive tokens get advantage 0 and return 0. Every expected
value is computed by hand.
"""

from __future__ import annotations

import pytest
import torch

from lit_ppo.algos import compute_gae
from tests.unit.values import assert_values
from tests.unit.values import tensor as _t


def _close(actual, expected, atol=1e-5, rtol=1e-5):
    assert_values(actual, expected, atol=atol, rtol=rtol)


# --------------------------------------------------------------------------------------------
# token level
# --------------------------------------------------------------------------------------------


def test_token_gamma_lambda_one_no_critic_broadcasts_outcome():
    # V = 0, gamma = lam = 1: every active token gets the outcome reward; prompt tokens 0.
    rewards = _t([[0, 0, 0, 0, 1.0], [0, 0, 0, -1.0, 0]])
    mask = _t([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])
    adv, ret = compute_gae(rewards, torch.zeros(2, 5), mask)
    _close(adv, [[0, 0, 1, 1, 1], [0, -1, -1, -1, 0]])
    _close(ret, [[0, 0, 1, 1, 1], [0, -1, -1, -1, 0]])


def test_token_hand_computed_areal_case4_data():
    # Data of AReaL's token-GAE case 4 (2 rows, gamma .9, lam .8; checked there against a reference loop),
    # label-aligned, recomputed for lit_ppo's semantics
    # (every active token including position S-1 is part of the recurrence).
    # gamma .9, lam .8 (gamma*lam = .72)
    # Row 0: r [0,.5,0,2], V [.1,.2,.3,.4], m [1,1,0,1], bootstrap 0
    #   t3: delta = 2 + 0 - .4 = 1.6                  A3 = 1.6
    #   t2: inactive -> 0
    #   t1: delta = .5 + .9*.4 - .2 = .66             A1 = .66 + .72*1.6 = 1.812
    #   t0: delta = 0 + .9*.2 - .1 = .08              A0 = .08 + .72*1.812 = 1.38464
    #   returns = A + V on active: [1.48464, 2.012, 0, 2.0]
    # Row 1: r [0,1,0,0], V [.2,.1,0,.5], m [0,1,1,1], no_eos True -> bootstrap V[3] = .5
    #   t3: delta = 0 + .9*.5 - .5 = -.05             A3 = -.05
    #   t2: delta = 0 + .9*.5 - 0 = .45               A2 = .45 - .72*.05 = .414
    #   t1: delta = 1 + .9*0 - .1 = .9                A1 = .9 + .72*.414 = 1.19808
    #   t0: inactive -> 0
    #   returns: [0, 1.29808, .414, .45]
    rewards = _t([[0, 0.5, 0, 2], [0, 1, 0, 0]])
    values = _t([[0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.0, 0.5]])
    mask = _t([[1, 1, 0, 1], [0, 1, 1, 1]])
    bootstrap = _t([0.0, 0.5])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8, bootstrap=bootstrap)
    _close(adv, [[1.38464, 1.812, 0, 1.6], [0, 1.19808, 0.414, -0.05]])
    _close(ret, [[1.48464, 2.012, 0, 2.0], [0, 1.29808, 0.414, 0.45]])


def test_token_per_row_lambda_case5():
    # case 5: rewards [0,0,1,0], mask [1,1,1,0], V = 0, lam [0.5, 0]
    # row 0: A2 = 1, A1 = .5, A0 = .25, A3 inactive = 0 ; row 1: [0,0,1,0]
    rewards = _t([[0, 0, 1.0, 0], [0, 0, 1.0, 0]])
    mask = _t([[1, 1, 1, 0], [1, 1, 1, 0]])
    adv, ret = compute_gae(rewards, torch.zeros(2, 4), mask, lam=_t([0.5, 0.0]))
    _close(adv, [[0.25, 0.5, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    _close(ret, [[0.25, 0.5, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])


def test_token_scalar_lam_equals_constant_tensor():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(3, 6, generator=g)
    values = torch.randn(3, 6, generator=g)
    mask = (torch.rand(3, 6, generator=g) > 0.3).float()
    a1, r1 = compute_gae(rewards, values, mask, gamma=0.9, lam=0.7)
    a2, r2 = compute_gae(rewards, values, mask, gamma=0.9, lam=torch.full((3,), 0.7))
    torch.testing.assert_close(a1, a2, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(r1, r2, atol=1e-6, rtol=1e-6)


def test_token_bootstrap_for_truncated_rows():
    # V [1,2,3], r [0,0,1], gamma .5, lam .5 (gamma*lam = .25)
    # row 0 truncated, bootstrap 4:
    #   t2: delta = 1 + .5*4 - 3 = 0        A2 = 0
    #   t1: delta = 0 + .5*3 - 2 = -.5      A1 = -.5
    #   t0: delta = 0 + .5*2 - 1 = 0        A0 = .25*-.5 = -.125
    #   returns [.875, 1.5, 3]
    # row 1 ended with EOS, bootstrap 0:
    #   t2: delta = 1 - 3 = -2              A2 = -2
    #   t1: delta = -.5                     A1 = -.5 + .25*-2 = -1
    #   t0: delta = 0                       A0 = -.25
    #   returns [.75, 1, 1]
    rewards = _t([[0, 0, 1.0], [0, 0, 1.0]])
    values = _t([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    mask = torch.ones(2, 3)
    adv, ret = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5, bootstrap=_t([4.0, 0.0]))
    _close(adv, [[-0.125, -0.5, 0.0], [-0.25, -1.0, -2.0]])
    _close(ret, [[0.875, 1.5, 3.0], [0.75, 1.0, 1.0]])


def test_token_bootstrap_none_equals_zero():
    rewards = _t([[0, 0, 1.0]])
    values = _t([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    a1, r1 = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    a2, r2 = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5, bootstrap=_t([0.0]))
    _close(a1, [[-0.25, -1.0, -2.0]])
    torch.testing.assert_close(a1, a2, atol=0, rtol=0)
    torch.testing.assert_close(r1, r2, atol=0, rtol=0)


def test_token_bootstrap_enters_after_trailing_padding():
    # the bootstrap is the value after the last *generated* token, even if padding follows it
    # r = 0, V [0, 1, 7(pad)], m [1,1,0], bootstrap 3, gamma = lam = 1:
    #   t1: delta = 0 + 3 - 1 = 2; A1 = 2 ; t0: delta = 0 + 1 - 0 = 1; A0 = 1 + 2 = 3
    adv, ret = compute_gae(
        torch.zeros(1, 3), _t([[0.0, 1.0, 7.0]]), _t([[1, 1, 0]]), bootstrap=_t([3.0])
    )
    _close(adv, [[3.0, 2.0, 0.0]])
    _close(ret, [[3.0, 3.0, 0.0]])


def test_token_masked_span_consumes_no_step():
    # m [1,0,0,1], V [0,9,9,0], r [0,5,0,1] (the reward at an inactive token is ignored), gamma .5, lam 1
    #   t3: delta = 1 - 0 = 1; A3 = 1
    #   t0: next value is V3 = 0 (not 9); delta = 0 + .5*0 - 0 = 0; A0 = 0 + .5*1 = .5
    # (if the span consumed steps, A0 would be .5**3 = .125 plus the V=9 terms)
    rewards = _t([[0, 5.0, 0, 1.0]])
    values = _t([[0, 9.0, 9.0, 0]])
    mask = _t([[1, 0, 0, 1]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.5, lam=1.0)
    _close(adv, [[0.5, 0.0, 0.0, 1.0]])
    _close(ret, [[0.5, 0.0, 0.0, 1.0]])


def test_token_inactive_tokens_get_zero_adv_and_returns():
    # prompt [0,1] inactive with large V; AReaL would give A = 1 and returns V + A there.
    # m [0,0,1,1], V [3,3,0,0], r [0,0,0,1], gamma = lam = 1 -> A = [0,0,1,1], returns [0,0,1,1]
    adv, ret = compute_gae(_t([[0, 0, 0, 1.0]]), _t([[3.0, 3.0, 0, 0]]), _t([[0, 0, 1, 1]]))
    _close(adv, [[0, 0, 1.0, 1.0]], atol=0, rtol=0)
    _close(ret, [[0, 0, 1.0, 1.0]], atol=0, rtol=0)


def test_token_all_masked_row_is_zero():
    adv, ret = compute_gae(_t([[1.0, 2.0], [0.0, 1.0]]), _t([[5.0, 5.0], [0.0, 0.0]]), _t([[0, 0], [1, 1]]))
    _close(adv, [[0, 0], [1.0, 1.0]], atol=0, rtol=0)
    _close(ret, [[0, 0], [1.0, 1.0]], atol=0, rtol=0)


def test_token_kl_rewards_added_to_rewards():
    # r [0,0,1], kl [-.1,-.2,-.3], V = 0, gamma = lam = 1: r + kl = [-.1,-.2,.7]
    # A2 = .7, A1 = .5, A0 = .4 ; returns = A
    adv, ret = compute_gae(
        _t([[0, 0, 1.0]]), torch.zeros(1, 3), torch.ones(1, 3), kl_rewards=_t([[-0.1, -0.2, -0.3]])
    )
    _close(adv, [[0.4, 0.5, 0.7]])
    _close(ret, [[0.4, 0.5, 0.7]])


def test_token_kl_on_inactive_tokens_ignored():
    # kl at inactive positions (should be 0 upstream) does not enter the recurrence
    adv, _ = compute_gae(
        _t([[0, 0, 1.0]]), torch.zeros(1, 3), _t([[1, 0, 1]]), kl_rewards=_t([[0.0, -5.0, 0.0]])
    )
    _close(adv, [[1.0, 0.0, 1.0]])


def test_token_bool_and_float_mask_agree():
    rewards = _t([[0, 0.5, 0, 2], [0, 1, 0, 0]])
    values = _t([[0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.0, 0.5]])
    mask = _t([[1, 1, 0, 1], [0, 1, 1, 1]])
    a1, r1 = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    a2, r2 = compute_gae(rewards, values, mask.bool(), gamma=0.9, lam=0.8)
    torch.testing.assert_close(a1, a2, atol=0, rtol=0)
    torch.testing.assert_close(r1, r2, atol=0, rtol=0)


def test_token_mode_ignores_turn_structure():
    # token mode with turn_ids given equals token mode without them
    rewards = _t([[0, 1.0, 0, 2.0]])
    mask = torch.ones(1, 4)
    tid = torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)
    a1, _ = compute_gae(rewards, torch.zeros(1, 4), mask, lam=0.5)
    a2, _ = compute_gae(rewards, torch.zeros(1, 4), mask, lam=0.5, turn_ids=tid, unit="token")
    # token: A3 = 2, A2 = 1, A1 = 1 + .5 = 1.5, A0 = .75
    _close(a1, [[0.75, 1.5, 1.0, 2.0]])
    torch.testing.assert_close(a1, a2, atol=0, rtol=0)


def test_outputs_do_not_modify_inputs():
    rewards = _t([[0, 0.5, 0, 2.0]])
    values = _t([[0.1, 0.2, 0.3, 0.4]])
    mask = _t([[1, 1, 0, 1]])
    kl = _t([[-0.1, 0.0, 0.0, -0.2]])
    copies = [x.clone() for x in (rewards, values, mask, kl)]
    compute_gae(rewards, values, mask, gamma=0.9, lam=0.8, kl_rewards=kl)
    for a, b in zip((rewards, values, mask, kl), copies):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# --------------------------------------------------------------------------------------------
# turn level
# --------------------------------------------------------------------------------------------


def _ids(x):
    return torch.tensor(x, dtype=torch.int32)


def test_turn_case1_one_lambda_per_turn():
    # r [0,1,0,2], V 0, turns [0,0,1,1], gamma 1, lam .5
    # R_1 = 2 -> A_1 = 2 ; R_0 = 1 -> A_0 = 1 + .5*2 = 2 ; A = returns = [2,2,2,2]
    # (token level would give [.75, 1.5, 1, 2])
    adv, ret = compute_gae(
        _t([[0, 1.0, 0, 2.0]]), torch.zeros(1, 4), torch.ones(1, 4), lam=0.5,
        turn_ids=_ids([[0, 0, 1, 1]]), unit="turn",
    )
    _close(adv, [[2.0, 2.0, 2.0, 2.0]])
    _close(ret, [[2.0, 2.0, 2.0, 2.0]])


def test_turn_case2_gap_first_token_value_bootstrap():
    # r [0,3,0,0,4], V [1,5,9,2,8], m [1,1,0,1,1], turns [0,0,-1,2,2], no_eos -> bootstrap V[4] = 8
    # gamma .5, lam .25. Turn 1 is empty (consumes no step).
    #   turn 2: R = 4, V_2 = V[3] = 2: delta = 4 + .5*8 - 2 = 6; A_2 = 6
    #   turn 0: R = 3, V_0 = V[0] = 1: delta = 3 + .5*2 - 1 = 3; A_0 = 3 + .125*6 = 3.75
    # returns = A_u + V_u on active tokens: turn 0 -> 4.75 (both tokens; not V[1] = 5),
    # turn 2 -> 8; the inactive token gets 0 (AReaL: 9).
    adv, ret = compute_gae(
        _t([[0, 3.0, 0, 0, 4.0]]), _t([[1.0, 5.0, 9.0, 2.0, 8.0]]), _t([[1, 1, 0, 1, 1]]),
        gamma=0.5, lam=0.25, bootstrap=_t([8.0]), turn_ids=_ids([[0, 0, -1, 2, 2]]), unit="turn",
    )
    _close(adv, [[3.75, 3.75, 0.0, 6.0, 6.0]])
    _close(ret, [[4.75, 4.75, 0.0, 8.0, 8.0]])


def test_turn_case3_per_row_lambda():
    # lam [0.5, 0.0] on case 1 data: row 1: A_1 = 2, A_0 = 1 -> [1,1,2,2]
    rewards = _t([[0, 1.0, 0, 2.0], [0, 1.0, 0, 2.0]])
    tid = _ids([[0, 0, 1, 1], [0, 0, 1, 1]])
    adv, ret = compute_gae(
        rewards, torch.zeros(2, 4), torch.ones(2, 4), lam=_t([0.5, 0.0]), turn_ids=tid, unit="turn"
    )
    _close(adv, [[2, 2, 2, 2], [1, 1, 2, 2]])
    _close(ret, [[2, 2, 2, 2], [1, 1, 2, 2]])


def test_turn_case21_kl_token_local():
    # label-aligned form of case 21: m [1,1,1,1,0], turns [0,0,1,1,-1], outcome 2 on the last
    # generated token (t = 3), kl = -[0,.2,.4,0,0], V = 0, gamma = lam = 1.
    #   recurrence on task rewards only: R_1 = 2 -> A_1 = 2; R_0 = 0 -> A_0 = 0 + 2 = 2
    #   A_t = A_u + kl_t = [2, 1.8, 1.6, 2, 0]; returns (KL excluded) = [2,2,2,2,0]
    rewards = _t([[0, 0, 0, 2.0, 0]])
    kl = _t([[0, -0.2, -0.4, 0, 0]])
    adv, ret = compute_gae(
        rewards, torch.zeros(1, 5), _t([[1, 1, 1, 1, 0]]), kl_rewards=kl,
        turn_ids=_ids([[0, 0, 1, 1, -1]]), unit="turn",
    )
    _close(adv, [[2.0, 1.8, 1.6, 2.0, 0.0]])
    _close(ret, [[2.0, 2.0, 2.0, 2.0, 0.0]])


def test_token_mode_same_data_as_case21_includes_kl_in_recurrence():
    # token: r + kl = [0,-.2,-.4,2,0]; A3 = 2, A2 = 1.6, A1 = 1.4, A0 = 1.4; returns = A
    rewards = _t([[0, 0, 0, 2.0, 0]])
    kl = _t([[0, -0.2, -0.4, 0, 0]])
    adv, ret = compute_gae(rewards, torch.zeros(1, 5), _t([[1, 1, 1, 1, 0]]), kl_rewards=kl)
    _close(adv, [[1.4, 1.4, 1.6, 2.0, 0.0]])
    _close(ret, [[1.4, 1.4, 1.6, 2.0, 0.0]])


def test_turn_kl_with_critic_and_discount():
    # m [1,1,1], turns [0,0,1], r [0,1,3], V [2,4,1], kl [-.5,.25,-1], gamma .5, lam .5, bootstrap 0
    #   turn 1: R = 3, V_1 = 1: delta = 3 + 0 - 1 = 2; A_1 = 2
    #   turn 0: R = 1, V_0 = 2: delta = 1 + .5*1 - 2 = -.5; A_0 = -.5 + .25*2 = 0
    #   adv = [0 - .5, 0 + .25, 2 - 1] = [-.5, .25, 1]; returns = [2, 2, 3]
    adv, ret = compute_gae(
        _t([[0, 1.0, 3.0]]), _t([[2.0, 4.0, 1.0]]), torch.ones(1, 3), gamma=0.5, lam=0.5,
        kl_rewards=_t([[-0.5, 0.25, -1.0]]), turn_ids=_ids([[0, 0, 1]]), unit="turn",
    )
    _close(adv, [[-0.5, 0.25, 1.0]])
    _close(ret, [[2.0, 2.0, 3.0]])


def test_turn_empty_ids_consume_no_step():
    # turns [0,0,3,3] must equal turns [0,0,1,1] (ids 1..2 are unused), with gamma .5, lam .5:
    #   turn B: R = 2 -> A = 2 ; turn A: R = 1, delta = 1 + .5*0 - 0 = 1, A = 1 + .25*2 = 1.5
    rewards = _t([[0, 1.0, 0, 2.0]])
    mask = torch.ones(1, 4)
    a1, r1 = compute_gae(rewards, torch.zeros(1, 4), mask, gamma=0.5, lam=0.5,
                         turn_ids=_ids([[0, 0, 3, 3]]), unit="turn")
    a2, r2 = compute_gae(rewards, torch.zeros(1, 4), mask, gamma=0.5, lam=0.5,
                         turn_ids=_ids([[0, 0, 1, 1]]), unit="turn")
    _close(a1, [[1.5, 1.5, 2.0, 2.0]])
    _close(a2, [[1.5, 1.5, 2.0, 2.0]])
    _close(r1, [[1.5, 1.5, 2.0, 2.0]])


def test_turn_masked_span_between_turns_consumes_no_step():
    # turn 0 = t0..1, tool output t2..3 (inactive, -1, value 9, reward 7 ignored), turn 1 = t4
    # V [1,1,9,9,2], r [0,1,7,0,3], gamma .5, lam 1, bootstrap 0
    #   turn 1: R = 3, V = 2 -> delta = 1; A_1 = 1
    #   turn 0: R = 1, V = 1 -> delta = 1 + .5*2 - 1 = 1; A_0 = 1 + .5*1 = 1.5
    #   returns: turn 0 -> 2.5, turn 1 -> 3
    adv, ret = compute_gae(
        _t([[0, 1.0, 7.0, 0, 3.0]]), _t([[1.0, 1.0, 9.0, 9.0, 2.0]]), _t([[1, 1, 0, 0, 1]]),
        gamma=0.5, lam=1.0, turn_ids=_ids([[0, 0, -1, -1, 1]]), unit="turn",
    )
    _close(adv, [[1.5, 1.5, 0, 0, 1.0]])
    _close(ret, [[2.5, 2.5, 0, 0, 3.0]])


def test_turn_reward_summed_over_turn_tokens():
    # R_0 = .5 + .25 + 1 = 1.75 (all task rewards of the turn), V = 0, one turn
    adv, ret = compute_gae(
        _t([[0.5, 0.25, 1.0]]), torch.zeros(1, 3), torch.ones(1, 3),
        turn_ids=_ids([[2, 2, 2]]), unit="turn",
    )
    _close(adv, [[1.75, 1.75, 1.75]])
    _close(ret, [[1.75, 1.75, 1.75]])


def test_turn_bootstrap_per_row():
    # one turn per row: V_0 = V[first] = 1; row 0 bootstrap 4, row 1 bootstrap 0; gamma .5
    #   row 0: delta = 1 + .5*4 - 1 = 2 ; row 1: delta = 1 + 0 - 1 = 0
    rewards = _t([[0, 1.0], [0, 1.0]])
    values = _t([[1.0, 3.0], [1.0, 3.0]])
    adv, ret = compute_gae(
        rewards, values, torch.ones(2, 2), gamma=0.5, lam=0.9, bootstrap=_t([4.0, 0.0]),
        turn_ids=_ids([[0, 0], [0, 0]]), unit="turn",
    )
    _close(adv, [[2.0, 2.0], [0.0, 0.0]])
    _close(ret, [[3.0, 3.0], [1.0, 1.0]])


def test_turn_mode_all_masked_row():
    adv, ret = compute_gae(
        _t([[1.0, 2.0], [0.0, 1.0]]), _t([[3.0, 4.0], [0.0, 0.0]]), _t([[0, 0], [1, 1]]),
        turn_ids=_ids([[-1, -1], [0, 0]]), unit="turn",
    )
    _close(adv, [[0, 0], [1.0, 1.0]], atol=0, rtol=0)
    _close(ret, [[0, 0], [1.0, 1.0]], atol=0, rtol=0)


def test_turn_one_token_per_turn_equals_token_mode():
    # with turn_ids = position on active tokens and no KL, turn GAE is token GAE
    g = torch.Generator().manual_seed(7)
    rewards = torch.randn(3, 6, generator=g)
    values = torch.randn(3, 6, generator=g)
    mask = _t([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 1, 1]])
    tid = torch.where(mask.bool(), torch.arange(6).expand(3, 6), torch.full((3, 6), -1)).to(torch.int64)
    boot = _t([0.3, -1.0, 0.0])
    lam = _t([0.9, 0.5, 1.0])
    a_tok, r_tok = compute_gae(rewards, values, mask, gamma=0.8, lam=lam, bootstrap=boot)
    a_turn, r_turn = compute_gae(rewards, values, mask, gamma=0.8, lam=lam, bootstrap=boot,
                                 turn_ids=tid, unit="turn")
    torch.testing.assert_close(a_tok, a_turn, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r_tok, r_turn, atol=1e-5, rtol=1e-5)


def test_turn_ids_on_inactive_tokens_do_not_form_a_turn():
    # only active tokens contribute: turn 1 has no active token, so it is invalid (no step), and
    # the reward 5 / value 9 on its inactive tokens are ignored.
    # m [1,1,0,0], ids [0,0,1,1], r [0,1,5,0], V [0,0,9,9], gamma .5, bootstrap 0
    #   turn 0: delta = 1 + .5*0 - 0 = 1 -> A = 1 ; returns = 1 + V[0] = 1
    # (if turn 1 counted: A_1 = 5 - 9 = -4 and turn 0 would get 1 + .5*9 + .5*lam*(-4))
    adv, ret = compute_gae(
        _t([[0, 1.0, 5.0, 0]]), _t([[0, 0, 9.0, 9.0]]), _t([[1, 1, 0, 0]]), gamma=0.5, lam=1.0,
        turn_ids=_ids([[0, 0, 1, 1]]), unit="turn",
    )
    _close(adv, [[1.0, 1.0, 0.0, 0.0]])
    _close(ret, [[1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_turn_ids_integer_dtypes_accepted(dtype):
    tid = torch.tensor([[0, 0, 1, 1]], dtype=dtype)
    adv, _ = compute_gae(_t([[0, 1.0, 0, 2.0]]), torch.zeros(1, 4), torch.ones(1, 4), lam=0.5,
                         turn_ids=tid, unit="turn")
    _close(adv, [[2.0, 2.0, 2.0, 2.0]])


def test_turn_inactive_minus_one_between_turns_is_not_a_decrease():
    # the -1 on the inactive token is skipped by the nondecreasing check
    tid = _ids([[0, -1, 1, -1]])
    adv, _ = compute_gae(_t([[1.0, 0, 1.0, 0]]), torch.zeros(1, 4), _t([[1, 0, 1, 0]]),
                         turn_ids=tid, unit="turn")
    # turn 1: A = 1 ; turn 0: A = 1 + 1 = 2
    _close(adv, [[2.0, 0.0, 1.0, 0.0]])


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def _turn(tid, mask=None, T=4):
    mask = torch.ones(1, T) if mask is None else mask
    return compute_gae(torch.zeros(1, T), torch.zeros(1, T), mask, turn_ids=tid, unit="turn")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_turn_ids_float_dtype_rejected(dtype):
    tid = torch.tensor([[0, 0, 1, 1]]).to(dtype)
    with pytest.raises(ValueError, match="integer dtype"):
        _turn(tid)


def test_turn_ids_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        _turn(_ids([[0, 0, 1]]))
    with pytest.raises(ValueError, match="shape"):
        _turn(_ids([0, 0, 1, 1]))


def test_turn_ids_active_negative():
    with pytest.raises(ValueError, match="non-negative"):
        _turn(_ids([[-1, 0, 0, 1]]))


def test_turn_ids_too_large():
    with pytest.raises(ValueError, match="smaller than the sequence length"):
        _turn(_ids([[0, 0, 4, 4]]))


def test_turn_ids_decreasing():
    with pytest.raises(ValueError, match="nondecreasing"):
        _turn(_ids([[0, 1, 0, 2]]))


def test_turn_ids_decreasing_across_inactive_gap():
    # active ids 1 then 0 (with an inactive -1 between) still violate the running maximum
    with pytest.raises(ValueError, match="nondecreasing"):
        _turn(_ids([[1, -1, 0, 0]]), mask=_t([[1, 0, 1, 1]]))


def test_turn_ids_decreasing_in_second_row():
    tid = _ids([[0, 0, 1, 1], [0, 2, 1, 2]])
    with pytest.raises(ValueError, match="nondecreasing"):
        compute_gae(torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(2, 4), turn_ids=tid, unit="turn")


def test_turn_unit_without_turn_ids():
    with pytest.raises(ValueError):
        compute_gae(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 4), unit="turn")


@pytest.mark.parametrize("unit", ["episode", "Token", "", "sequence"])
def test_invalid_unit(unit):
    with pytest.raises(ValueError):
        compute_gae(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 4), unit=unit)

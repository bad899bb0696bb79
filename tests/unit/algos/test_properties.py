"""Property tests: ``normalize`` and ``compute_gae`` agree with slow pure-Python reference loops
written here from the math (docs/algorithms.md#normalisation; docs/algorithms.md#gae, token and turn
level) on random inputs. The references work in Python floats (float64) on the float32-rounded inputs.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lit_ppo.algos import compute_gae, normalize
from lit_ppo.config import NormConfig

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

F32 = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False, allow_infinity=False, width=32)


def _grid(draw, B, T, elements=F32):
    return [[draw(elements) for _ in range(T)] for _ in range(B)]


# ============================================================================================
# compute_gae reference loops
# ============================================================================================


def ref_token_gae(r, v, m, gamma, lam, boot, kl):
    B, T = len(r), len(r[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        next_v = boot[b]
        last = 0.0
        for t in range(T - 1, -1, -1):
            if not m[b][t]:
                continue
            reward = r[b][t] + (kl[b][t] if kl is not None else 0.0)
            delta = reward + gamma * next_v - v[b][t]
            last = delta + gamma * lam[b] * last
            next_v = v[b][t]
            adv[b][t] = last
            ret[b][t] = last + v[b][t]
    return adv, ret


def ref_turn_gae(r, v, m, gamma, lam, boot, kl, tid):
    B, T = len(r), len(r[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        turns = {}  # id -> [sum of task rewards, first active position]
        for t in range(T):
            if m[b][t]:
                u = tid[b][t]
                if u not in turns:
                    turns[u] = [0.0, t]
                turns[u][0] += r[b][t]
        a_u = {}
        next_v = boot[b]
        last = 0.0
        for u in sorted(turns, reverse=True):
            R_u, first = turns[u]
            V_u = v[b][first]
            delta = R_u + gamma * next_v - V_u
            last = delta + gamma * lam[b] * last
            next_v = V_u
            a_u[u] = (last, V_u)
        for t in range(T):
            if m[b][t]:
                A, V_u = a_u[tid[b][t]]
                adv[b][t] = A + (kl[b][t] if kl is not None else 0.0)
                ret[b][t] = A + V_u
    return adv, ret


@st.composite
def gae_case(draw, turn_level: bool):
    B = draw(st.integers(1, 4))
    T = draw(st.integers(1, 8))
    r = _grid(draw, B, T)
    v = _grid(draw, B, T)
    m = [[draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    gamma = draw(st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.0]) | st.floats(0.0, 1.0))
    if draw(st.booleans()):
        lam_arg = draw(st.floats(0.0, 1.0))
        lam_rows = [lam_arg] * B
    else:
        lam_rows = [draw(st.floats(0.0, 1.0, width=32)) for _ in range(B)]
        lam_arg = torch.tensor(lam_rows, dtype=torch.float32)
    boot = [draw(F32) for _ in range(B)] if draw(st.booleans()) else None
    kl = _grid(draw, B, T) if draw(st.booleans()) else None
    tid = None
    if turn_level:
        tid = []
        for b in range(B):
            row = []
            cur = draw(st.integers(0, 2))
            seen = False
            for t in range(T):
                if m[b][t]:
                    if seen:
                        cur += draw(st.integers(0, 2))
                    seen = True
                    row.append(min(cur, T - 1))
                else:
                    row.append(-1)
            tid.append(row)
    return r, v, m, gamma, lam_arg, lam_rows, boot, kl, tid


def _run_gae(case, unit):
    r, v, m, gamma, lam_arg, lam_rows, boot, kl, tid = case
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    kwargs = dict(gamma=gamma, lam=lam_arg)
    if boot is not None:
        kwargs["bootstrap"] = f(boot)
    if kl is not None:
        kwargs["kl_rewards"] = f(kl)
    if unit == "turn":
        kwargs["turn_ids"] = torch.tensor(tid, dtype=torch.int64)
        kwargs["unit"] = "turn"
    adv, ret = compute_gae(f(r), f(v), f(m), **kwargs)
    boot_rows = boot if boot is not None else [0.0] * len(r)
    if unit == "turn":
        e_adv, e_ret = ref_turn_gae(r, v, m, gamma, lam_rows, boot_rows, kl, tid)
    else:
        e_adv, e_ret = ref_token_gae(r, v, m, gamma, lam_rows, boot_rows, kl)
    torch.testing.assert_close(adv.double(), torch.tensor(e_adv, dtype=torch.float64), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ret.double(), torch.tensor(e_ret, dtype=torch.float64), atol=1e-4, rtol=1e-4)


@SETTINGS
@given(gae_case(turn_level=False))
def test_token_gae_matches_reference(case):
    _run_gae(case, "token")


@SETTINGS
@given(gae_case(turn_level=True))
def test_turn_gae_matches_reference(case):
    _run_gae(case, "turn")


@SETTINGS
@given(gae_case(turn_level=False))
def test_turn_gae_one_token_per_turn_equals_token_gae(case):
    # turn ids = position on active tokens: each token is its own turn; without KL the turn
    # recurrence is the token recurrence.
    r, v, m, gamma, lam_arg, _, boot, _, _ = case
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    T = len(r[0])
    tid = torch.tensor([[t if m[b][t] else -1 for t in range(T)] for b in range(len(r))])
    kw = dict(gamma=gamma, lam=lam_arg, bootstrap=None if boot is None else f(boot))
    a1, r1 = compute_gae(f(r), f(v), f(m), **kw)
    a2, r2 = compute_gae(f(r), f(v), f(m), turn_ids=tid, unit="turn", **kw)
    torch.testing.assert_close(a1, a2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(r1, r2, atol=1e-4, rtol=1e-4)


# ============================================================================================
# normalize reference loop
# ============================================================================================


class _Ambiguous(Exception):
    """The spec does not pin this case down (group leave-one-out on a multi-element slice with
    exactly one active element); such examples are discarded."""


def ref_normalize(x, cfg: NormConfig, mask, group_sizes):
    """x, mask: lists of rows (each row a list; 1-D inputs are rows of one element)."""
    B = len(x)
    M = mask if mask is not None else [[1.0] * len(row) for row in x]
    if mask is not None and sum(sum(row) for row in M) == 0:
        return [list(row) for row in x]
    if group_sizes is not None:
        bounds, lo = [], 0
        for g in group_sizes:
            bounds.append((lo, lo + g))
            lo += g
    else:
        g = cfg.group_size
        bounds = [(k * g, (k + 1) * g) for k in range(B // g)]

    def elems(lo, hi):
        return [(b, t) for b in range(lo, hi) for t in range(len(x[b]))]

    def mean_over(es, mu):
        n = sum(M[b][t] for b, t in es)
        s = sum(x[b][t] * M[b][t] for b, t in es)
        for b, t in es:
            if not cfg.mean_leave1out:
                mu[b][t] = s / n if n > 0 else 0.0
            elif n <= 1:
                if slice_level_group and n == 1:
                    if len(es) == 1:
                        mu[b][t] = x[b][t]  # singleton slice with leave-one-out: mu = x
                    else:
                        raise _Ambiguous
                else:
                    mu[b][t] = 0.0
            elif M[b][t]:
                mu[b][t] = (s - x[b][t]) / max(n - 1, 1)
            else:
                mu[b][t] = s / n

    mu = [[0.0] * len(row) for row in x]
    if cfg.mean_level == "batch":
        slice_level_group = False
        mean_over(elems(0, B), mu)
    elif cfg.mean_level == "group":
        slice_level_group = True
        for lo, hi in bounds:
            mean_over(elems(lo, hi), mu)

    sigma = [[1.0] * len(row) for row in x]
    eps = cfg.eps

    def std_over(es):
        n = sum(M[b][t] for b, t in es)
        ss = sum((x[b][t] * M[b][t] - mu[b][t] * M[b][t]) ** 2 for b, t in es)
        if cfg.std_unbiased:
            s = math.sqrt(ss / (n - 1)) if n > 1 else 1.0
        else:
            s = math.sqrt(ss / n) if n > 0 else 1.0
        for b, t in es:
            sigma[b][t] = s

    if cfg.std_level == "batch":
        std_over(elems(0, B))
    elif cfg.std_level == "group":
        for lo, hi in bounds:
            std_over(elems(lo, hi))
    else:
        eps = 0.0

    return [
        [(x[b][t] - mu[b][t]) * M[b][t] / (sigma[b][t] + eps) for t in range(len(x[b]))]
        for b in range(B)
    ]


@st.composite
def norm_case(draw, explicit_sizes=None):
    B = draw(st.integers(1, 7))
    two_d = draw(st.booleans())
    T = draw(st.integers(1, 5)) if two_d else 1
    # a few repeated values make zero-variance groups likely
    elements = F32 | st.sampled_from([0.0, 1.0, 1.0, -2.0])
    x = _grid(draw, B, T, elements)
    mask = None
    if draw(st.booleans()):
        mask = [[float(draw(st.booleans())) for _ in range(T)] for _ in range(B)]
    cfg_kw = dict(
        mean_level=draw(st.sampled_from(["batch", "group", None])),
        mean_leave1out=draw(st.booleans()),
        std_level=draw(st.sampled_from(["batch", "group", None])),
        std_unbiased=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-3, 0.1, 1.0])),
    )
    group_sizes = None
    if explicit_sizes if explicit_sizes is not None else draw(st.booleans()):
        # random composition of B into positive parts
        cuts = sorted(draw(st.sets(st.integers(1, B - 1), max_size=B - 1))) if B > 1 else []
        edges = [0] + cuts + [B]
        group_sizes = [edges[i + 1] - edges[i] for i in range(len(edges) - 1)]
        cfg_kw["group_size"] = draw(st.integers(1, 3))  # ignored when group_sizes is given
    else:
        cfg_kw["group_size"] = draw(st.sampled_from([d for d in range(1, B + 1) if B % d == 0]))
    return x, mask, NormConfig(**cfg_kw), group_sizes, two_d


@SETTINGS
@given(norm_case(), st.booleans())
def test_normalize_matches_reference(case, sizes_as_tensor):
    x, mask, cfg, group_sizes, two_d = case
    try:
        expected = ref_normalize(x, cfg, mask, group_sizes)
    except _Ambiguous:
        assume(False)
    gs = group_sizes
    if gs is not None and sizes_as_tensor:
        gs = torch.tensor(gs, dtype=torch.int64)
    if two_d:
        xt = torch.tensor(x, dtype=torch.float32)
        mt = None if mask is None else torch.tensor(mask, dtype=torch.float32)
        exp = torch.tensor(expected, dtype=torch.float64)
    else:
        xt = torch.tensor([row[0] for row in x], dtype=torch.float32)
        mt = None if mask is None else torch.tensor([row[0] for row in mask], dtype=torch.float32)
        exp = torch.tensor([row[0] for row in expected], dtype=torch.float64)
    out = normalize(xt, cfg, mask=mt, group_sizes=gs)
    assert out.shape == xt.shape
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exp, atol=1e-5, rtol=1e-5)
    if mt is not None and mt.sum() > 0:
        assert torch.all(out[mt == 0] == 0)


@SETTINGS
@given(norm_case(explicit_sizes=False))
def test_normalize_group_size_fallback_equals_explicit_sizes(case):
    x, mask, cfg, group_sizes, two_d = case
    assert group_sizes is None
    xt = torch.tensor(x, dtype=torch.float32)
    mt = None if mask is None else torch.tensor(mask, dtype=torch.float32)
    g = cfg.group_size
    a = normalize(xt, cfg, mask=mt)
    b = normalize(xt, cfg, mask=mt, group_sizes=[g] * (len(x) // g))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, equal_nan=True)

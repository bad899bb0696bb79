"""The algorithm configs (``lit_ppo.config.algo``): NormConfig, RejectionSamplingConfig, PPOActorConfig and
PPOCriticConfig, their defaults, checks and warnings.

Defaults and rules are AReaL's, with the deviations of docs/algorithms.md#differences-from-areal
(binary_kl is valid, config-time ValueErrors instead of loss-time asserts).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from lit_ppo.algos import policy_loss
from lit_ppo.algos.checks import check_names
from lit_ppo.config import NormConfig, PPOActorConfig, PPOCriticConfig, RejectionSamplingConfig
from tests.unit.configs import checked_actor


def _raises(cls, fields, *, contains=(), **kwargs):
    """Construct cls(**kwargs); expect ValueError whose message names one of `fields` and every
    string of `contains`."""
    if isinstance(fields, str):
        fields = (fields,)
    with pytest.raises(ValueError) as ei:
        cls(**kwargs)
    msg = str(ei.value)
    assert any(f in msg for f in fields), f"message {msg!r} names none of {fields}"
    for c in contains:
        assert c in msg, f"message {msg!r} lacks {c!r}"
    return msg


def _no_user_warning(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    user = [w for w in rec if issubclass(w.category, UserWarning)]
    assert not user, [str(w.message) for w in user]
    return out


# ====================================================================== defaults


def test_norm_config_defaults():
    c = NormConfig()
    assert c.mean_level == "batch"
    assert c.mean_leave1out is False
    assert c.std_level == "batch"
    assert c.std_unbiased is True
    assert c.eps == 1e-5
    assert c.group_size == 1


def test_rejection_config_defaults():
    c = RejectionSamplingConfig()
    assert c.level == "token"
    assert c.action == "mask"
    assert c.metric == "ratio"
    assert c.agg == "mean"
    assert c.upper == 5.0
    assert c.lower is None


def test_actor_config_defaults():
    c = PPOActorConfig()
    expected = dict(
        ppo_n_minibatches=4,
        eps_clip=0.2,
        eps_clip_higher=None,
        c_clip=None,
        reward_norm=None,
        reward_scaling=1.0,
        reward_bias=0.0,
        reward_clip=20.0,
        overlong_reward_penalty=False,
        overlong_tokens=None,
        overlong_penalty_factor=None,
        mask_no_eos_with_zero=False,
        discount=1.0,
        gae_lambda=1.0,
        gae_lambda_kwargs={},
        gae_timestep_unit="token",
        adv_norm=None,
        kl_ctl=0.1,
        kl_estimator="k1",
        use_sapo_loss=False,
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        recompute_logprob=False,
        use_decoupled_loss=False,
        rejection_sampling=None,
        importance_sampling_level="token",
        max_new_tokens=1024,
        temperature=1.0,
        policy_loss="ppo",
        adv_estimator="gae",
        loss_agg_mode="token-mean",
        entropy_coef=0.0,
    )
    for k, v in expected.items():
        got = getattr(c, k)
        assert got == v and type(got) is type(v) or (v is None and got is None), (k, got, v)


def test_actor_config_mutable_default_not_shared():
    a, b = PPOActorConfig(), PPOActorConfig()
    assert a.gae_lambda_kwargs == {} and a.gae_lambda_kwargs is not b.gae_lambda_kwargs


def test_critic_config_defaults():
    c = PPOCriticConfig()
    assert c.ppo_n_minibatches == 4
    assert c.eps_clip == 0.5


@pytest.mark.parametrize("cls", [NormConfig, RejectionSamplingConfig, PPOActorConfig, PPOCriticConfig])
def test_are_dataclasses(cls):
    assert dataclasses.is_dataclass(cls)


def test_keyword_construction_keeps_values():
    c = PPOActorConfig(
        ppo_n_minibatches=2,
        eps_clip=0.3,
        eps_clip_higher=0.28,
        c_clip=3.0,
        discount=0.99,
        gae_lambda=0.95,
        kl_ctl=0.0,
        kl_estimator="k3",
        max_new_tokens=16,
        temperature=0.7,
        entropy_coef=0.01,
        loss_agg_mode="seq-mean-token-mean",
    )
    assert (c.ppo_n_minibatches, c.eps_clip, c.eps_clip_higher, c.c_clip) == (2, 0.3, 0.28, 3.0)
    assert (c.discount, c.gae_lambda, c.kl_ctl, c.kl_estimator) == (0.99, 0.95, 0.0, "k3")
    assert (c.max_new_tokens, c.temperature, c.entropy_coef, c.loss_agg_mode) == (16, 0.7, 0.01, "seq-mean-token-mean")


# ====================================================================== NormConfig validation


def test_norm_mean_level_invalid():
    _raises(NormConfig, "mean_level", contains=("bogus", "batch", "group"), mean_level="bogus")


def test_norm_std_level_invalid():
    _raises(NormConfig, "std_level", contains=("bogus", "batch", "group"), std_level="bogus")


@pytest.mark.parametrize("gs", [0, -2, 2.5])
def test_norm_group_size_invalid(gs):
    _raises(NormConfig, "group_size", mean_level="group", std_level="group", group_size=gs)


def test_norm_eps_negative():
    _raises(NormConfig, "eps", eps=-1e-3)


def test_norm_valid_variants():
    for kw in (
        dict(mean_level=None, std_level=None),
        dict(mean_level="group", std_level="batch", group_size=4),
        dict(mean_level="batch", std_level=None, mean_leave1out=True),
        dict(eps=0.0),
    ):
        c = NormConfig(**kw)
        for k, v in kw.items():
            assert getattr(c, k) == v


# ====================================================================== RejectionSamplingConfig


@pytest.mark.parametrize(
    "field, bad, allowed",
    [
        ("level", "tok", ("token", "sequence")),
        ("action", "drop", ("mask", "clamp")),
        ("metric", "kl_k4", ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")),
        ("agg", "median", ("mean", "sum", "max")),
    ],
)
def test_rejection_enum_invalid(field, bad, allowed):
    kw = {field: bad}
    if field == "agg":
        kw["level"] = "sequence"
    _raises(RejectionSamplingConfig, field, contains=(bad,) + allowed, **kw)


@pytest.mark.parametrize("upper", [1.0, 0.5])
def test_rejection_ratio_upper_must_exceed_one(upper):
    _raises(RejectionSamplingConfig, "upper", metric="ratio", upper=upper)


@pytest.mark.parametrize("lower", [-0.1, 0.0])
def test_rejection_ratio_lower_must_be_positive(lower):
    _raises(RejectionSamplingConfig, "lower", metric="ratio", lower=lower, upper=5.0)


@pytest.mark.parametrize("metric", ["kl_k2", "kl_k3", "binary_kl"])
@pytest.mark.parametrize("upper", [0.0, -1.0])
def test_rejection_nonnegative_metrics_need_positive_upper(metric, upper):
    _raises(RejectionSamplingConfig, "upper", metric=metric, upper=upper)


@pytest.mark.parametrize(
    "kw",
    [
        dict(metric="kl_k1", lower=1.0, upper=0.5),
        dict(metric="ratio", lower=3.0, upper=2.0),
        dict(metric="kl_k2", lower=0.6, upper=0.5),
    ],
)
def test_rejection_lower_above_upper(kw):
    _raises(RejectionSamplingConfig, ("lower", "upper"), **kw)


def test_rejection_kl_k1_may_be_nonpositive():
    c = RejectionSamplingConfig(metric="kl_k1", upper=0.0)
    assert c.upper == 0.0
    c = RejectionSamplingConfig(metric="kl_k1", lower=-1.0, upper=-0.5)
    assert (c.lower, c.upper) == (-1.0, -0.5)


@pytest.mark.parametrize("metric", ["kl_k1", "kl_k2", "kl_k3", "binary_kl"])
def test_rejection_clamp_requires_ratio(metric):
    _raises(RejectionSamplingConfig, ("action", "metric", "clamp"), action="clamp", metric=metric, upper=1.0)


def test_rejection_binary_kl_is_valid():
    c = RejectionSamplingConfig(level="token", action="mask", metric="binary_kl", upper=2.0)
    assert c.metric == "binary_kl" and c.upper == 2.0
    c = RejectionSamplingConfig(level="sequence", action="mask", metric="binary_kl", agg="max", upper=0.1)
    assert c.metric == "binary_kl"


def test_rejection_clamp_sets_lower_zero():
    c = RejectionSamplingConfig(action="clamp", metric="ratio", upper=5.0)
    assert c.lower == 0.0
    c = RejectionSamplingConfig(action="clamp", metric="ratio", lower=0.5, upper=5.0)
    assert c.lower == 0.5
    c = RejectionSamplingConfig(action="mask", metric="ratio", upper=5.0)
    assert c.lower is None


@pytest.mark.parametrize("agg", ["sum", "max"])
def test_rejection_token_level_agg_warns(agg):
    with pytest.warns(UserWarning, match="ignored") as rec:
        RejectionSamplingConfig(level="token", agg=agg)
    assert any("agg" in str(w.message) for w in rec)


@pytest.mark.parametrize("agg", ["sum", "max", "mean"])
def test_rejection_sequence_level_agg_no_warning(agg):
    _no_user_warning(lambda: RejectionSamplingConfig(level="sequence", agg=agg))


def test_rejection_token_mean_no_warning():
    _no_user_warning(lambda: RejectionSamplingConfig(level="token", agg="mean"))


# ====================================================================== PPOActorConfig validation


@pytest.mark.parametrize("c", [1.0, 0.5, -2.0])
def test_actor_c_clip_must_exceed_one(c):
    _raises(PPOActorConfig, "c_clip", c_clip=c)


def test_actor_c_clip_valid():
    assert PPOActorConfig(c_clip=1.01).c_clip == 1.01


def test_actor_overlong_requires_tokens_and_factor():
    _raises(PPOActorConfig, "overlong_tokens", overlong_reward_penalty=True, overlong_penalty_factor=1.0)
    _raises(PPOActorConfig, "overlong_penalty_factor", overlong_reward_penalty=True, overlong_tokens=4)
    c = PPOActorConfig(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=1.0)
    assert (c.overlong_tokens, c.overlong_penalty_factor) == (4, 1.0)
    # without the penalty the missing fields are fine
    PPOActorConfig(overlong_reward_penalty=False)


def test_actor_multi_objective_aggregation_choices_and_the_overlong_penalty():
    _raises(PPOActorConfig, "multi_objective_aggregation", multi_objective_aggregation="mean",
            contains=("'sum_then_normalize', 'normalize_then_sum'",))
    _raises(PPOActorConfig, "multi_objective_aggregation", overlong_reward_penalty=True, overlong_tokens=4,
            overlong_penalty_factor=1.0, multi_objective_aggregation="normalize_then_sum",
            contains=("give it as a reward function of its own",))
    assert PPOActorConfig(multi_objective_aggregation="normalize_then_sum").multi_objective_aggregation == \
        "normalize_then_sum"


@pytest.mark.parametrize(
    "field, bad, allowed",
    [
        ("gae_timestep_unit", "episode", ("token", "turn")),
        ("kl_estimator", "k4", ("k1", "k2", "k3")),
        ("importance_sampling_level", "seq", ("token", "sequence")),
    ],
)
def test_actor_enum_fields_invalid(field, bad, allowed):
    _raises(PPOActorConfig, field, contains=(bad,) + allowed, **{field: bad})


@pytest.mark.parametrize(
    "field, val",
    [("gae_timestep_unit", "turn"), ("kl_estimator", "k2"), ("kl_estimator", "k3"),
     ("importance_sampling_level", "sequence")],
)
def test_actor_enum_fields_valid(field, val):
    assert getattr(PPOActorConfig(**{field: val}), field) == val


@pytest.mark.parametrize(
    "bad",
    [
        True,
        False,
        "",
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.1,
        1.1,
        None,
        [0.5],
        "no_such_package_xyz.module.fn",
        "math.no_such_function_xyz",
        "nodots",
    ],
)
def test_actor_gae_lambda_invalid(bad):
    # A number out of range or of the wrong type fails the config; a path that does not import fails
    # where names are resolved (check_names), before any model loads.
    _raises(checked_actor, "gae_lambda", gae_lambda=bad)


def test_a_config_with_an_unknown_name_builds_and_check_names_refuses_it():
    cfg = PPOActorConfig(policy_loss="no_such_loss", adv_estimator="no_such_est", gae_lambda="math.no_such_fn")
    with pytest.raises(ValueError, match="policy_loss='no_such_loss' is invalid"):
        check_names(cfg)


@pytest.mark.parametrize("good", [0.0, 1.0, 0.95, 0, 1, "lit_ppo.algos.lambda_fn.vapo_length_adaptive_gae"])
def test_actor_gae_lambda_valid(good):
    c = PPOActorConfig(gae_lambda=good, gae_lambda_kwargs={"alpha": 0.05})
    assert c.gae_lambda == good
    assert c.gae_lambda_kwargs == {"alpha": 0.05}


def test_actor_kl_ctl_negative():
    _raises(PPOActorConfig, "kl_ctl", kl_ctl=-0.1)
    assert PPOActorConfig(kl_ctl=0.0).kl_ctl == 0.0


@pytest.mark.parametrize("n", [0, -1])
def test_actor_ppo_n_minibatches(n):
    _raises(PPOActorConfig, "ppo_n_minibatches", ppo_n_minibatches=n)


@pytest.mark.parametrize("t", [0.0, -1.0])
def test_actor_temperature_positive(t):
    _raises(PPOActorConfig, "temperature", temperature=t)


def test_actor_unknown_policy_loss():
    _raises(checked_actor, "policy_loss", contains=("no_such_loss", "ppo", "sapo"), policy_loss="no_such_loss")


def test_actor_unknown_adv_estimator():
    _raises(checked_actor, "adv_estimator", contains=("no_such_est", "gae"), adv_estimator="no_such_est")


def test_actor_unknown_loss_agg_mode():
    _raises(
        PPOActorConfig,
        "loss_agg_mode",
        contains=("token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
        loss_agg_mode="token-sum",
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_actor_loss_agg_modes_valid(mode):
    assert PPOActorConfig(loss_agg_mode=mode).loss_agg_mode == mode


# ====================================================================== warnings


def test_actor_rejection_without_decoupled_warns_ignored():
    with pytest.warns(UserWarning, match="ignored"):
        PPOActorConfig(use_decoupled_loss=False, rejection_sampling=RejectionSamplingConfig())


def test_actor_rejection_with_decoupled_no_ignored_warning():
    def make():
        return PPOActorConfig(use_decoupled_loss=True, rejection_sampling=RejectionSamplingConfig(lower=0.5))

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        make()
    assert not [w for w in rec if "ignored" in str(w.message)]


def test_actor_default_no_warning():
    _no_user_warning(PPOActorConfig)


# ====================================================================== dict -> dataclass


def test_actor_norm_dicts_converted():
    c = PPOActorConfig(
        reward_norm={"mean_level": "group", "std_level": None, "group_size": 4},
        adv_norm={"mean_level": "batch", "std_level": "batch", "std_unbiased": False, "eps": 1e-8},
    )
    assert isinstance(c.reward_norm, NormConfig)
    assert (c.reward_norm.mean_level, c.reward_norm.std_level, c.reward_norm.group_size) == ("group", None, 4)
    assert c.reward_norm.eps == 1e-5  # unspecified fields take the defaults
    assert isinstance(c.adv_norm, NormConfig)
    assert (c.adv_norm.std_unbiased, c.adv_norm.eps) == (False, 1e-8)


def test_actor_rejection_dict_converted():
    c = PPOActorConfig(
        use_decoupled_loss=True,
        rejection_sampling={"level": "token", "action": "mask", "metric": "binary_kl", "upper": 2.0},
    )
    assert isinstance(c.rejection_sampling, RejectionSamplingConfig)
    rs = c.rejection_sampling
    assert (rs.level, rs.action, rs.metric, rs.upper, rs.lower, rs.agg) == (
        "token", "mask", "binary_kl", 2.0, None, "mean")


def test_actor_rejection_dict_clamp_sets_lower():
    c = PPOActorConfig(use_decoupled_loss=True, rejection_sampling={"action": "clamp", "upper": 3.0})
    assert c.rejection_sampling.lower == 0.0


def test_actor_dicts_are_validated():
    with pytest.raises(ValueError, match="mean_level"):
        PPOActorConfig(reward_norm={"mean_level": "bogus"})
    with pytest.raises(ValueError, match="std_level"):
        PPOActorConfig(adv_norm={"std_level": "bogus"})
    with pytest.raises(ValueError, match="upper"):
        PPOActorConfig(use_decoupled_loss=True, rejection_sampling={"metric": "ratio", "upper": 1.0})


def test_actor_dataclass_instances_pass_through():
    n = NormConfig(mean_level="group", group_size=8)
    r = RejectionSamplingConfig(lower=0.5, upper=5.0)
    c = PPOActorConfig(reward_norm=n, adv_norm=NormConfig(), use_decoupled_loss=True, rejection_sampling=r)
    assert c.reward_norm == n and c.rejection_sampling == r
    assert isinstance(c.adv_norm, NormConfig)


# ====================================================================== SAPO <-> policy_loss


def test_use_sapo_loss_sets_policy_loss():
    c = PPOActorConfig(use_sapo_loss=True)
    assert c.policy_loss == "sapo"
    assert c.use_sapo_loss is True


def test_policy_loss_sapo_sets_use_sapo_loss():
    c = PPOActorConfig(policy_loss="sapo")
    assert c.use_sapo_loss is True
    assert c.policy_loss == "sapo"


def test_policy_loss_sapo_selects_sapo_in_loss():
    # r = 1, A = 1, tau+ = 1: gate 4 * sigmoid(0) = 2 -> loss -2 (PPO would give -1).
    cfg = PPOActorConfig(policy_loss="sapo", sapo_tau_pos=1.0)
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), cfg)
    torch.testing.assert_close(loss.detach(), torch.tensor(-2.0), rtol=1e-6, atol=1e-6)

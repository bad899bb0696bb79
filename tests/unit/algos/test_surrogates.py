"""The registered surrogates with their config rules and log-ratio transforms (``lit_ppo.algos.surrogates``):
a config builds, and the rule registered with its loss refuses what the loss cannot take where the names
are resolved (``check_names``), with the same one-line messages. The surrogates' values and gradients are
in test_losses.py, through ``policy_loss``."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import POLICY_LOSSES, policy_loss, register_policy_loss
from lit_ppo.algos.checks import check_names
from lit_ppo.config import PPOActorConfig
from lit_ppo.config.checks import fail
from tests.unit.configs import checked_actor


def _refused(message: str, **kwargs) -> None:
    with pytest.raises(ValueError) as e:
        checked_actor(**kwargs)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"eps_clip_higher": None}, "eps_clip_higher=None is invalid: must be > 0 with policy_loss='cispo'"),
    ({"eps_clip_higher": 0.0}, "eps_clip_higher=0.0 is invalid: must be > 0 with policy_loss='cispo'"),
    ({"eps_clip_higher": 4.0, "importance_sampling_level": "sequence"},
     "importance_sampling_level='sequence' is invalid: must be 'token' with policy_loss='cispo'"),
    ({"eps_clip_higher": 4.0, "c_clip": 3.0}, "c_clip=3.0 is invalid: must be null with policy_loss='cispo'"),
    ({"eps_clip_higher": 4.0, "use_sapo_loss": True}, "policy_loss='cispo' is invalid: must be 'sapo' (or unset)"),
])
def test_cispo_settings_that_do_not_apply_are_refused(kwargs, message):
    _refused(message, policy_loss="cispo", **kwargs)


def test_gmpo_needs_the_sequence_level():
    _refused("importance_sampling_level='token' is invalid: must be 'sequence' with policy_loss='gmpo' (its ratio "
             "is the geometric mean of the clipped token ratios)", policy_loss="gmpo")


def test_gpg_refuses_the_sequence_level():
    _refused("importance_sampling_level='sequence' is invalid: must be 'token' with policy_loss='gpg' (its loss is "
             "on each token's log-prob)", policy_loss="gpg", importance_sampling_level="sequence")


@pytest.mark.parametrize("field, val", [("sapo_tau_pos", 0.0), ("sapo_tau_pos", -1.0), ("sapo_tau_neg", 0.0),
                                        ("sapo_tau_neg", -0.5)])
@pytest.mark.parametrize("selected", [{"use_sapo_loss": True}, {"policy_loss": "sapo"}])
def test_sapo_gate_temperatures_are_positive(selected, field, val):
    _refused(f"{field}={val!r} is invalid: must be a finite number > 0.0", **selected, **{field: val})


@pytest.mark.parametrize("selected", [{"use_sapo_loss": True}, {"policy_loss": "sapo"}])
def test_sapo_refuses_the_decoupled_loss(selected):
    _refused("use_decoupled_loss=True is invalid: must be false with SAPO (use_sapo_loss / policy_loss='sapo')",
             **selected, use_decoupled_loss=True)


def test_a_rule_binds_its_loss_only():
    # The settings one loss refuses are the config of another: the rules go with the name.
    assert checked_actor(importance_sampling_level="sequence", sapo_tau_pos=0.0).policy_loss == "ppo"
    PPOActorConfig(policy_loss="gmpo")  # the config layer builds it; check_names refuses it
    with pytest.raises(ValueError, match="with policy_loss='gmpo'"):
        check_names(PPOActorConfig(policy_loss="gmpo"))


def test_a_new_loss_is_one_function_with_its_rule_and_log_ratio_transform():
    name = "test_only_halved_log_ratio"

    def needs_token_level(actor):
        if actor.importance_sampling_level != "token":
            fail("importance_sampling_level", actor.importance_sampling_level, f"'token' with policy_loss={name!r}")

    def halved(log_ratio, advantages, cfg):
        return log_ratio / 2

    @register_policy_loss(name, log_ratio=halved, rule=needs_token_level)
    def reinforce(ratio, advantages, cfg):
        return -advantages * ratio, {}

    try:
        assert POLICY_LOSSES.get(name) is reinforce
        assert POLICY_LOSSES.rule(name) is needs_token_level and POLICY_LOSSES.log_ratio(name) is halved
        _refused(f"importance_sampling_level='sequence' is invalid: must be 'token' with policy_loss={name!r}",
                 policy_loss=name, importance_sampling_level="sequence")
        # log r = 1 halved: L = -A e^0.5, dL/dlogp = -A e^0.5 / 2.
        logp = torch.ones(1, 1, requires_grad=True)
        loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool),
                              checked_actor(policy_loss=name))
        loss.backward()
        torch.testing.assert_close(loss.detach(), torch.tensor(-math.exp(0.5)))
        torch.testing.assert_close(logp.grad, torch.tensor([[-math.exp(0.5) / 2]]))
    finally:
        POLICY_LOSSES.unregister(name)
    assert POLICY_LOSSES.rule(name) is None and POLICY_LOSSES.log_ratio(name) is None


def test_only_gmpo_transforms_the_log_ratio():
    assert [n for n in POLICY_LOSSES.names() if POLICY_LOSSES.log_ratio(n) is not None] == ["gmpo"]
    assert POLICY_LOSSES.get("gmpo") is POLICY_LOSSES.get("unclipped")

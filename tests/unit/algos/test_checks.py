"""The policy-loss and advantage-estimator registries (``lit_ppo.algos.losses``, ``lit_ppo.algos.gae``) and
the names an actor config refers to resolved against them (``lit_ppo.algos.checks``): the built-ins, an
unknown name listing the registered ones, and a registered function selectable by name and used."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    policy_loss,
    register_advantage_estimator,
    register_policy_loss,
)
from tests.unit.configs import checked_actor


def _unregister(reg, name):
    if name in reg:
        reg.unregister(name)


def test_builtin_registrations():
    assert callable(POLICY_LOSSES.get("ppo"))
    assert callable(POLICY_LOSSES.get("sapo"))
    assert callable(ADVANTAGE_ESTIMATORS.get("gae"))


def test_registry_unknown_name_lists_registered():
    with pytest.raises(ValueError) as ei:
        POLICY_LOSSES.get("definitely_not_a_loss")
    msg = str(ei.value)
    assert "definitely_not_a_loss" in msg and "ppo" in msg and "sapo" in msg
    with pytest.raises(ValueError) as ei:
        ADVANTAGE_ESTIMATORS.get("definitely_not_an_estimator")
    assert "gae" in str(ei.value)


def test_register_policy_loss_selectable_and_used():
    name = "test_only_triple_reinforce"
    with pytest.raises(ValueError):
        checked_actor(policy_loss=name)
    seen = {}

    @register_policy_loss(name)
    def triple(ratio, advantages, cfg):
        seen["cfg"] = cfg
        seen["shape"] = tuple(ratio.shape)
        return -3.0 * advantages * ratio, {}

    try:
        assert POLICY_LOSSES.get(name) is triple
        cfg = checked_actor(policy_loss=name)
        assert cfg.policy_loss == name and cfg.use_sapo_loss is False
        # r = [2, 1, e^.5 (masked)], A = [1, -1, 2]; N = 2
        # loss = -3 (1*2 + (-1)*1) / 2 = -1.5 ; grad = -3 A r / N = [-3, 1.5, 0]
        logp = torch.tensor([[math.log(2.0), 0.0, 0.5]], requires_grad=True)
        adv = torch.tensor([[1.0, -1.0, 2.0]])
        mask = torch.tensor([[True, True, False]])
        loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, mask, cfg)
        loss.backward()
        torch.testing.assert_close(loss.detach(), torch.tensor(-1.5), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(logp.grad, torch.tensor([[-3.0, 1.5, 0.0]]), rtol=1e-6, atol=1e-6)
        assert seen["cfg"].policy_loss == name
        assert seen["shape"] == (1, 3)
    finally:
        _unregister(POLICY_LOSSES, name)
    with pytest.raises(ValueError):
        POLICY_LOSSES.get(name)
    with pytest.raises(ValueError):
        checked_actor(policy_loss=name)


def test_register_advantage_estimator_selectable():
    name = "test_only_adv_estimator"

    @register_advantage_estimator(name)
    def est(*args, **kwargs):  # pragma: no cover - never called here
        raise NotImplementedError

    try:
        assert ADVANTAGE_ESTIMATORS.get(name) is est
        assert checked_actor(adv_estimator=name).adv_estimator == name
    finally:
        _unregister(ADVANTAGE_ESTIMATORS, name)
    with pytest.raises(ValueError):
        checked_actor(adv_estimator=name)

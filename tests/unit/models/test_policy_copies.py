"""Copies of the policy (``lit_ppo.models.policy_copies``): the reference is a frozen copy of its own."""

from __future__ import annotations

import torch

from lit_ppo.models import build_reference, token_logprobs
from tests.unit.values import same_weights as _same_weights


def test_reference_is_frozen_copy(tiny, batch):
    policy, _ = tiny
    reference = build_reference(policy)
    assert not reference.training
    assert all(not p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in policy.parameters())
    assert _same_weights(policy, reference)
    assert reference.lm_head.weight.data_ptr() != policy.lm_head.weight.data_ptr()
    logp, _ = token_logprobs(reference, *batch)
    assert not logp.requires_grad
    torch.testing.assert_close(logp, token_logprobs(policy, *batch)[0].detach())

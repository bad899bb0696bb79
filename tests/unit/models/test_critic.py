"""The critic (``lit_ppo.models.critic``): it starts at zero with its own copy of the policy's body, and its
values are label-aligned (docs/algorithms.md#data-layout)."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.models import ValueModel, build_critic


def test_critic_starts_at_zero_with_a_copy_of_the_body(tiny, batch):
    policy, _ = tiny
    critic = build_critic(policy)
    assert isinstance(critic, ValueModel)
    values, final = critic.values(*batch)
    assert (values == 0).all() and (final == 0).all()
    body_params = dict(critic.body.named_parameters())
    for name, p in policy.model.named_parameters():
        assert torch.equal(body_params[name], p) and body_params[name].data_ptr() != p.data_ptr()


def test_critic_values_are_label_aligned(tiny, batch):
    policy, _ = tiny
    input_ids, mask = batch
    critic = build_critic(policy)
    with torch.no_grad():
        critic.head.weight.normal_(generator=torch.Generator().manual_seed(1))
        critic.head.bias.fill_(0.25)
        hidden = critic.body(input_ids=input_ids, attention_mask=mask.long()).last_hidden_state
    w, bias = critic.head.weight[0], 0.25
    values, final = critic(input_ids, mask)
    lengths = mask.sum(1).tolist()
    for b, length in enumerate(lengths):
        for t in range(input_ids.shape[1]):
            want = (hidden[b, t - 1] @ w + bias).item() if 0 < t < length else 0.0
            assert values[b, t].item() == pytest.approx(want, abs=1e-5), (b, t)
        assert final[b].item() == pytest.approx((hidden[b, length - 1] @ w + bias).item(), abs=1e-5)
    assert lengths[0] != lengths[1]  # the batch really has right padding
    (values.sum() + final.sum()).backward()
    assert critic.body.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in policy.parameters())  # separate weights

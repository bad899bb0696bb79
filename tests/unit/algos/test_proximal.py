"""The proximal log-prob approximations (lit_ppo.algos.proximal) on hand-computed values: alpha from the
tokens' versions, loglinear and linear interpolation, tokens without a version or on-policy."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos.proximal import approximate_prox_logp, prox_alpha
from lit_ppo.config import PPOActorConfig


def test_alpha_is_how_far_the_weights_before_the_update_lie_from_the_sampling_ones():
    # V = 3, the update makes version 4: v = 3 (on-policy) 0; v = 2: 1/2; v = 1: 2/3; v = 0: 3/4; -1 (prompt) 0.
    alpha = prox_alpha(torch.tensor([[3, 2, 1, 0, -1]]), 3)
    torch.testing.assert_close(alpha, torch.tensor([[0.0, 0.5, 2 / 3, 0.75, 0.0]]))


def test_loglinear():
    # v = 0 with V = 1: alpha 1/2, behave -1, theta -1.5 -> -1.25; v = 0 and 2 with V = 3: alpha 3/4 and 1/2.
    one = approximate_prox_logp(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[0]]), 1, "loglinear")
    torch.testing.assert_close(one, torch.tensor([[-1.25]]))
    two = approximate_prox_logp(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.4]]), torch.tensor([[0, 2]]), 3,
                                "loglinear")
    torch.testing.assert_close(two, torch.tensor([[-1.0 + 0.75 * -0.5, -2.0 + 0.5 * -0.4]]))


def test_linear_mixes_the_probabilities():
    # p_behave .5, p_theta .25, alpha 1/2: log(.375).
    out = approximate_prox_logp(torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]]),
                                torch.tensor([[0]]), 1, "linear")
    assert float(out) == pytest.approx(math.log(0.375), abs=1e-6)


@pytest.mark.parametrize("method", ["loglinear", "linear"])
def test_on_policy_and_versionless_tokens_keep_the_behaviour_log_prob(method):
    behave = torch.tensor([[-0.7, -3.0]])
    theta = torch.tensor([[-0.2, -1.0]], requires_grad=True)
    out = approximate_prox_logp(behave, theta, torch.tensor([[5, -1]]), 5, method)
    torch.testing.assert_close(out, behave)
    assert not out.requires_grad


def test_an_approximation_needs_the_decoupled_loss():
    with pytest.raises(ValueError, match=r"^prox_logp_method='loglinear' is invalid: must be 'recompute' without "
                                         r"use_decoupled_loss=true"):
        PPOActorConfig(prox_logp_method="loglinear")
    with pytest.raises(ValueError, match=r"^prox_logp_method='cubic' is invalid: must be one of 'recompute', "
                                         r"'loglinear', 'linear'$"):
        PPOActorConfig(prox_logp_method="cubic", use_decoupled_loss=True)

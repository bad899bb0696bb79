"""Clip-Cov's and KL-Cov's token selection (``lit_ppo.algos.covariance``); their effect on the loss is in
test_losses.py, through ``policy_loss``."""

from __future__ import annotations

import torch

from lit_ppo.algos.covariance import clip_cov_dropped, kl_cov_chosen, token_covariance
from lit_ppo.config import ClipCovConfig, KLCovConfig

# A = [1, 1, -1, -1], log pi_theta = [-.1, -2, -.2, -3]: means 0 and -1.325, so Cov = [1.225, -.675, -1.125, 1.675].
ADV, LOGP = torch.tensor([[1.0, 1.0, -1.0, -1.0]]), torch.tensor([[-0.1, -2.0, -0.2, -3.0]])
ALL = torch.ones(1, 4, dtype=torch.bool)


def test_covariance_of_advantage_and_log_prob():
    torch.testing.assert_close(token_covariance(ADV, LOGP, ALL), torch.tensor([[1.225, -0.675, -1.125, 1.675]]))


def test_clip_cov_draws_among_the_candidates_within_the_bounds():
    cov = token_covariance(ADV, LOGP, ALL)
    # (1, 5) holds tokens 0 and 3; floor(0.5 * 4) = 2 are drawn, so both.
    assert clip_cov_dropped(cov, ALL, 4, ClipCovConfig(ratio=0.5)).tolist() == [[True, False, False, True]]
    # Token 3 is no candidate (the surrogate clipped it): at least one is drawn, token 0.
    candidates = torch.tensor([[True, True, True, False]])
    assert clip_cov_dropped(cov, candidates, 4, ClipCovConfig()).tolist() == [[True, False, False, False]]


def test_kl_cov_chooses_the_valid_tokens_of_largest_covariance():
    cov = token_covariance(ADV, LOGP, ALL)
    assert kl_cov_chosen(cov, ALL, KLCovConfig(ratio=0.5)).tolist() == [[True, False, False, True]]
    assert kl_cov_chosen(cov, torch.tensor([[True, True, True, False]]), KLCovConfig()).tolist() == \
        [[True, False, False, False]]
    assert not kl_cov_chosen(cov, torch.zeros(1, 4, dtype=torch.bool), KLCovConfig()).any()

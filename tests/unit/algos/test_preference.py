"""The Bradley-Terry loss of ``lit_ppo.algos.preference`` and its gradient against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos.preference import bradley_terry_loss, pair_metrics


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("margin, center", [(None, None), ([0.5, 0.0, 1.0], None), ([0.5, 0.0, 1.0], 0.01)])
def test_loss_and_gradient_match_a_hand_computation(margin, center):
    chosen_values, rejected_values = [1.0, -0.5, 2.0], [0.0, 0.5, 2.5]
    margins = margin or [0.0, 0.0, 0.0]
    chosen = torch.tensor(chosen_values, requires_grad=True)
    rejected = torch.tensor(rejected_values, requires_grad=True)
    loss = bradley_terry_loss(chosen, rejected, None if margin is None else torch.tensor(margin), center)
    loss.backward()
    n, c = 3, center or 0.0
    d = [a - b - m for a, b, m in zip(chosen_values, rejected_values, margins)]
    s = [a + b for a, b in zip(chosen_values, rejected_values)]
    expected = sum(-math.log(_sigmoid(x)) for x in d) / n + c * sum(x * x for x in s) / n
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # d/dr_chosen of -log sigmoid(d) / n is -(1 - sigmoid(d)) / n; of c * s^2 / n it is 2 c s / n; r_rejected: the
    # first with the opposite sign, the second the same.
    for i in range(n):
        assert chosen.grad[i].item() == pytest.approx(-(1 - _sigmoid(d[i])) / n + 2 * c * s[i] / n, rel=1e-5)
        assert rejected.grad[i].item() == pytest.approx((1 - _sigmoid(d[i])) / n + 2 * c * s[i] / n, rel=1e-5)


def test_pair_metrics_are_sums_over_pairs():
    sums = pair_metrics(torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0.0, 0.5, 2.5]))
    assert {k: round(float(v), 6) for k, v in sums.items()} == {
        "correct": 1.0, "margin": 1 - 1 - 0.5, "reward": 5.5, "reward_sq": 1 + 0.25 + 4 + 0 + 0.25 + 6.25, "pairs": 3.0}

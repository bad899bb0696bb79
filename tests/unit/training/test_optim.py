"""The optimizer (``lit_ppo.training.optim``) without a Trainer: the learning rate's warm-up and schedule, and
AdamW fused on CPU."""

from __future__ import annotations

import pytest
import torch

from lit_ppo.config import OptimizerConfig
from lit_ppo.training.optim import adamw_with_schedule, lr_multiplier


def test_the_learning_rate_warms_up_then_follows_its_schedule():
    linear = lr_multiplier(OptimizerConfig(warmup_steps=2, lr_schedule="linear", min_lr_ratio=0.1), total_steps=6)
    assert [round(linear(s), 6) for s in range(7)] == [round(1 / 3, 6), round(2 / 3, 6), 1.0, 0.775, 0.55, 0.325, 0.1]
    cosine = lr_multiplier(OptimizerConfig(warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1), total_steps=6)
    assert cosine(4) == pytest.approx(0.55) and cosine(6) == pytest.approx(0.1) and cosine(9) == pytest.approx(0.1)
    constant = lr_multiplier(OptimizerConfig(warmup_steps=1), total_steps=0)
    assert [constant(s) for s in range(3)] == [0.5, 1.0, 1.0]
    optimizer, scheduler = adamw_with_schedule([torch.nn.Parameter(torch.zeros(2))],
                                               OptimizerConfig(lr=0.2, warmup_steps=1), total_steps=0)
    assert optimizer.param_groups[0]["lr"] == 0.1 and optimizer.defaults["fused"]  # fused on CPU
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.2

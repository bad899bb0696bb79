"""The Bradley-Terry loss of a reward model on preference pairs, as TRL's RewardTrainer defines it, and the
pair metrics it logs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coefficient: float | None = None) -> torch.Tensor:
    """The mean over pairs of ``-log sigmoid(r_chosen - r_rejected - margin)`` (the probability that the chosen
    side wins under the Bradley-Terry model, a pair's ``margin`` the lead it must win by), plus
    ``center_coefficient * mean((r_chosen + r_rejected)^2)``, which pulls the rewards towards 0. ``chosen``,
    ``rejected``, ``margin``: ``[pairs]``."""
    difference = chosen.float() - rejected.float()
    if margin is not None:
        difference = difference - margin.float()
    loss = -F.logsigmoid(difference).mean()
    if center_coefficient is not None:
        loss = loss + center_coefficient * (chosen.float() + rejected.float()).square().mean()
    return loss


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over the pairs of ``chosen`` and ``rejected`` rewards (``[pairs]``), so that shards and batches add
    up: ``correct`` (pairs where the chosen side scores higher), ``margin`` (``r_chosen - r_rejected``),
    ``reward`` and ``reward_sq`` (over both sides), and ``pairs``."""
    chosen, rejected = chosen.detach().float(), rejected.detach().float()
    both = torch.cat([chosen, rejected])
    return {"correct": (chosen > rejected).float().sum(), "margin": (chosen - rejected).sum(),
            "reward": both.sum(), "reward_sq": both.square().sum(),
            "pairs": torch.tensor(float(chosen.numel()), device=chosen.device)}

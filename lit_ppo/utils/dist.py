"""Collectives over the ranks of a run, which are no-ops in a single process.

Every sum or maximum over ranks in the package goes through here, so the question "is there more
than one rank?" is answered in one place: torch.distributed built in, a process group initialised,
and more than one rank in it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def several_ranks() -> bool:
    """Whether this process is one of several ranks of an initialised process group."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed element-wise over all ranks: a new tensor (``tensor`` itself in one process)."""
    if several_ranks():
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def world_sum(value: float, device: torch.device) -> float:
    """``value`` summed over all ranks, in float64 on ``device`` (the collective's backend device)."""
    if several_ranks():
        t = torch.tensor(float(value), device=device, dtype=torch.float64)
        dist.all_reduce(t)
        return float(t)
    return float(value)


def world_max(value: int, device: torch.device) -> int:
    """The largest ``value`` over all ranks."""
    if several_ranks():
        t = torch.tensor(int(value), device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)
    return int(value)

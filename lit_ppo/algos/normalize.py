"""The normalisation operator of rewards and advantages (docs/algorithms.md#normalisation).

x is ``[B]`` (one reward per row) or ``[B, T]`` (token advantages). Statistics are float64; the
mean mu is per element (leave-one-out makes it so) and the std is taken around that same mu, so
with ``mean_level=None`` the std is the RMS and with group mean + batch std (LitePPO) it is the std
of the group-centred residuals. Batch statistics are summed over all ranks when torch.distributed
is initialised; groups never span ranks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from lit_ppo.config import NormConfig
from lit_ppo.utils.dist import sum_over_ranks


def _group_ids(batch_size: int, cfg: NormConfig, group_sizes, device) -> tuple[torch.Tensor, int]:
    """Group index of every row, and the number of groups."""
    if group_sizes is None:
        g = cfg.group_size
        if batch_size % g:
            raise ValueError(f"group_size={g} must divide the batch size {batch_size} "
                             "(or pass the batch's group_sizes)")
        sizes = torch.full((batch_size // g,), g, dtype=torch.long, device=device)
    else:
        sizes = torch.as_tensor(group_sizes, dtype=torch.long, device=device).reshape(-1)
        if (sizes <= 0).any():
            raise ValueError(f"group_sizes must all be positive, got {sizes.tolist()}")
        if int(sizes.sum()) != batch_size:
            raise ValueError(f"sum of group_sizes ({int(sizes.sum())}) must equal the batch size {batch_size}")
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes), len(sizes)


def _segment_sum(per_row: torch.Tensor, gid: torch.Tensor | None, n_groups: int) -> torch.Tensor:
    """Sum ``[B, ...]`` values over the rows of each segment -> ``[n_groups]`` (batch: one, all ranks)."""
    rows = per_row.reshape(per_row.shape[0], -1).sum(1)
    if gid is None:
        return sum_over_ranks(rows.sum().reshape(1))
    return torch.zeros(n_groups, dtype=rows.dtype, device=rows.device).index_add_(0, gid, rows)


def normalize(x: torch.Tensor, cfg: NormConfig | None, mask: torch.Tensor | None = None,
              group_sizes: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """(x - mu) / (sigma + eps) over the masked elements; masked outputs are 0. See module docstring."""
    if cfg is None:
        return x
    if mask is not None and mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal x shape {tuple(x.shape)}")
    m = torch.ones_like(x, dtype=torch.float64) if mask is None else mask.to(torch.float64)
    if mask is not None and sum_over_ranks(m.sum().reshape(1)).item() == 0:
        return x
    B = x.shape[0]
    x64 = x.to(torch.float64)
    grouped = "group" in (cfg.mean_level, cfg.std_level)
    gid, n_groups = _group_ids(B, cfg, group_sizes, x.device) if grouped else (None, 1)

    def segments(level: str) -> tuple[torch.Tensor | None, int]:
        return (gid, n_groups) if level == "group" else (None, 1)

    def per_element(seg_values: torch.Tensor, seg_gid: torch.Tensor | None) -> torch.Tensor:
        """Broadcast ``[n_segments]`` statistics back to the shape of x."""
        rows = seg_values.expand(B) if seg_gid is None else seg_values[seg_gid]
        return rows.reshape((B,) + (1,) * (x.dim() - 1)).expand_as(x64)

    if cfg.mean_level is None:
        mu = torch.zeros_like(x64)
    else:
        seg_gid, n_seg = segments(cfg.mean_level)
        s = per_element(_segment_sum(x64 * m, seg_gid, n_seg), seg_gid)
        n = per_element(_segment_sum(m, seg_gid, n_seg), seg_gid)
        mu = torch.where(n > 0, s / n.clamp(min=1), torch.zeros_like(s))
        if cfg.mean_leave1out:
            others = (s - x64 * m) / (n - m).clamp(min=1)
            mu = torch.where(m > 0, others, mu)
            # One element alone: batch level passes it through (mu = 0), a group centres it to 0.
            alone = x64 if cfg.mean_level == "group" else torch.zeros_like(x64)
            mu = torch.where(n <= 1, alone, mu)

    centred = (x64 - mu) * m
    if cfg.std_level is None:
        sigma, eps = torch.ones_like(x64), 0.0
    else:
        seg_gid, n_seg = segments(cfg.std_level)
        ss = per_element(_segment_sum(centred.square(), seg_gid, n_seg), seg_gid)
        n = per_element(_segment_sum(m, seg_gid, n_seg), seg_gid)
        if cfg.std_unbiased:
            sigma = torch.where(n <= 1, torch.ones_like(ss), (ss / (n - 1).clamp(min=1)).sqrt())
        else:
            sigma = torch.where(n == 0, torch.ones_like(ss), (ss / n.clamp(min=1)).sqrt())
        eps = cfg.eps
    return (centred / (sigma + eps)).to(torch.float32)


def normalize_then_sum(terms: torch.Tensor, weights: torch.Tensor, cfg: NormConfig | None,
                       group_sizes: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """GDPO's decoupled normalisation (docs/algorithms.md#several-rewards-normalised) of ``terms`` ``[B, K]``, the
    values of K reward functions: each column normalised by ``cfg`` on its own, their sum weighted by
    ``weights`` ``[K]``, that sum normalised over the batch's rows (mean and std over all ranks, with ``cfg``'s
    Bessel correction and eps). ``[B]`` float32."""
    columns = [normalize(column, cfg, group_sizes=group_sizes).double() for column in terms.unbind(1)]
    weighted = sum(w * column for w, column in zip(weights.double().tolist(), columns))
    batch = replace(cfg or NormConfig(), mean_level="batch", mean_leave1out=False, std_level="batch")
    return normalize(weighted, batch)


def gpg_alpha(rewards: torch.Tensor, group_sizes: Sequence[int] | torch.Tensor | None,
              group_size: int = 1) -> float:
    """GPG's correction alpha = B / (B - M) of the rows ``[B]`` with rewards ``rewards``: M of them lie in groups
    whose rewards are all equal (they carry no advantage), both counted over all ranks; 1.0 when every
    group is such a group (no row has an advantage to scale)."""
    gid, n_groups = _group_ids(rewards.shape[0], NormConfig(group_size=group_size), group_sizes, rewards.device)
    r = rewards.to(torch.float64)
    high = torch.full((n_groups,), -torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, gid, r, "amax")
    low = torch.full((n_groups,), torch.inf, dtype=torch.float64, device=r.device).scatter_reduce(0, gid, r, "amin")
    uniform_rows = (high == low)[gid].sum()
    counts = sum_over_ranks(torch.stack([torch.tensor(float(r.shape[0]), dtype=torch.float64, device=r.device),
                                         uniform_rows.to(torch.float64)]))
    informative = float(counts[0] - counts[1])
    return float(counts[0]) / informative if informative > 0 else 1.0

"""The passes of an RL iteration over a batch: without gradients micro-batch by micro-batch, and the update of
one model (the actor or the critic) over token-balanced minibatches, one optimizer step each.

Two rules make an update independent of the micro-batching and of the world size. Every micro-batch
loss is normalised by its minibatch's global token (and sequence) count, so the gradients of the
micro-batches of all ranks add up to the minibatch loss's. And every rank takes part in every
collective the same number of times: the same number of minibatches and, within each, of
micro-batches (a rank with fewer pads with passes at weight 0), since DDP all-reduces gradients in
each backward pass and a sharded model gathers its weights in each forward pass.

A step whose loss or gradient is not finite is skipped on every rank alike (the loss is summed over
ranks, the gradient norm taken after the all-reduce): its gradients are dropped and the weights and
optimizer state stay as they were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.utilities import rank_zero_warn

from lit_ppo.config import PPOActorConfig, PPOCriticConfig
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.training.fsdp import full_tensor
from lit_ppo.utils.dist import sum_over_ranks, world_max, world_sum

Statistics = dict[str, dict[str, tuple[torch.Tensor | float, torch.Tensor | float | None]]]
"""A micro-batch's statistics by metric group (``{"actor": {name: (value, tokens)}}``): a mean over ``tokens``
tokens, or, with ``tokens`` None, the micro-batch's share of a minibatch total (a term of the loss)."""
MicroLoss = Callable[[RolloutBatch, torch.Tensor, float, float, int], tuple[torch.Tensor, Statistics]]
"""``micro_loss(sub_batch, rows, n_tokens, n_seqs, minibatch)``: the loss of the micro-batch ``sub_batch``
(rows ``rows`` of the batch) as its share of its minibatch's, which holds ``n_tokens`` loss tokens and
``n_seqs`` sequences over all ranks, and its ``Statistics``; ``<prefix>/loss`` is the loss itself."""


def balanced_partition(weights: list[int], parts: int) -> list[list[int]]:
    """Split item indices into ``parts`` lists of near-equal total weight (longest first to the
    lightest part); each list keeps the original order. Parts may be empty when items are few."""
    bins: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = min(range(parts), key=loads.__getitem__)
        bins[lightest].append(i)
        loads[lightest] += weights[i]
    return [sorted(b) for b in bins]


def micro_batches(rows: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive groups of rows whose padded size (rows x longest row) stays within ``max_tokens``;
    a single row longer than the budget forms its own micro-batch."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for r in rows:
        if current and (len(current) + 1) * max(longest, lengths[r]) > max_tokens:
            out.append(current)
            current, longest = [], 0
        current.append(r)
        longest = max(longest, lengths[r])
    if current:
        out.append(current)
    return out


def equalised_micro_batches(rows: list[int], lengths: list[int], max_tokens: int,
                            device: torch.device) -> list[list[int]]:
    """``micro_batches`` of ``rows``, padded with empty ones up to the largest count over ranks."""
    mbs = micro_batches(rows, lengths, max_tokens)
    return mbs + [[] for _ in range(world_max(len(mbs), device) - len(mbs))]


@dataclass
class MetricSum:
    """Weighted running sums of statistics: a mean of each micro-batch weighted by the tokens it is a mean
    over, so that the sum's mean is the statistic over all of them; a minibatch total weighted by 1."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, torch.Tensor | float], weight: float, prefix: str) -> None:
        """Add each statistic, weighted by ``weight``, under ``<prefix>/<name>``."""
        for name, value in stats.items():
            key = f"{prefix}/{name}"
            self.sums[key] = self.sums.get(key, 0.0) + float(value) * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def merge(self, other: MetricSum) -> None:
        """Add ``other``'s sums and weights to these."""
        for key, value in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.weights[key] = self.weights.get(key, 0.0) + other.weights[key]

    def means(self) -> dict[str, float]:
        """The weighted mean of every statistic."""
        return {k: self.sums[k] / max(self.weights[k], 1e-12) for k in self.sums}


@torch.no_grad()
def stitched_passes(fn: Callable[[RolloutBatch], torch.Tensor | tuple[torch.Tensor, ...]], batch: RolloutBatch,
                    max_tokens: int, *, models: list[torch.nn.Module], every_rank_joins: bool) -> list[torch.Tensor]:
    """Apply ``fn(sub_batch)`` micro-batch by micro-batch, without gradients; stitch its ``[b, t]`` / ``[b]``
    outputs back into ``[B, T]`` / ``[B]`` tensors (sub-batches are trimmed to their longest row).
    ``models`` run in eval mode meanwhile (no dropout: old log-probs and values are what the engine
    computes). ``every_rank_joins``: every rank runs as many passes as the rank with the most, the
    surplus ones discarded (a sharded model's forward pass is a collective)."""
    modes = [(m, m.training) for m in models]
    for model, _ in modes:
        model.eval()
    try:
        B, T = batch.input_ids.shape
        lengths = batch.attention_mask.sum(1).tolist()
        outputs: list[torch.Tensor] = []
        rows_per_pass = micro_batches(list(range(B)), lengths, max_tokens)
        if every_rank_joins:
            device = batch.input_ids.device
            rows_per_pass += [[] for _ in range(world_max(len(rows_per_pass), device) - len(rows_per_pass))]
        for rows in rows_per_pass:
            if not rows:
                fn(batch.select([0]))
                continue
            result = fn(batch.select(rows))
            result = result if isinstance(result, tuple) else (result,)
            if not outputs:
                outputs = [r.new_zeros((B, T) if r.dim() == 2 else (B,)) for r in result]
            idx = torch.as_tensor(rows, device=batch.input_ids.device)
            for out, r in zip(outputs, result):
                if r.dim() == 2:
                    out[idx, :r.shape[1]] = r
                else:
                    out[idx] = r
        return outputs
    finally:
        for model, training in modes:
            model.train(training)


def optimizer_step(optimizer: LightningOptimizer, model: torch.nn.Module, clip: float | None, *,
                   counts_as_global_step: bool, loss_finite: bool) -> tuple[float, bool]:
    """Clip and apply the gradients; returns their norm before clipping and whether the update was
    applied. Lightning counts every step of its optimizer wrapper as a global step: exactly one step
    per RL iteration goes through it (``counts_as_global_step``), so that trainer.max_steps counts
    iterations; the others step the wrapped torch optimizer directly.

    The update is skipped when the loss was not finite (``loss_finite``, already agreed over ranks)
    or the gradient norm is not (identical on every rank: it is taken after the gradient
    all-reduce). A skipped step drops the gradients and still calls ``step``: AdamW leaves
    parameters without a gradient untouched, their state (step count, moments) included, and the
    wrapper still counts the iteration."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip is not None else float("inf"))
    grad_norm = float(full_tensor(norm))  # sharded: the norm over all shards
    applied = loss_finite and math.isfinite(grad_norm)
    if not applied:
        optimizer.zero_grad(set_to_none=True)
    if counts_as_global_step:
        optimizer.step()
    else:
        optimizer.optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, applied


def optimize(batch: RolloutBatch, micro_loss: MicroLoss, cfg: PPOActorConfig | PPOCriticConfig, *, prefix: str,
             model: torch.nn.Module, optimizer: LightningOptimizer, counts_as_global_step: bool,
             backward: Callable[[torch.Tensor], None], world_size: int, version: int, sums: MetricSum) -> int:
    """One pass of ``model`` over ``cfg.ppo_n_minibatches`` token-balanced minibatches of ``batch``, one
    optimizer step each, in micro-batches of at most ``cfg.mb_max_tokens`` tokens. Returns the number of
    skipped steps (non-finite loss or gradient, see ``optimizer_step``); their statistics are left out
    of ``sums``, which gets ``<prefix>/skipped_steps`` instead.

    Args:
        batch: this rank's rows, on the model's device.
        micro_loss: the loss of a micro-batch (``MicroLoss``).
        cfg: the model's minibatches, micro-batch budget and gradient clipping.
        prefix: the metric group of the step statistics ('actor', 'critic').
        model, optimizer: what is updated, and the Lightning wrapper of its optimizer.
        counts_as_global_step: the last step of this pass is the iteration's one global step.
        backward: Lightning's ``manual_backward``.
        world_size: the number of ranks, whose gradients DDP / FSDP average.
        version: the policy version being trained, for the warning of a skipped step.
        sums: receives the statistics of the applied steps.
    """
    device = batch.input_ids.device
    lengths = batch.attention_mask.sum(1).tolist()
    tokens = batch.loss_mask.sum(1)
    # Every rank takes the same number of steps, also one holding fewer rows than minibatches
    # (its surplus minibatches are empty and join each step's collectives at weight 0).
    minibatches = balanced_partition(tokens.tolist(), world_max(min(cfg.ppo_n_minibatches, batch.num_rows), device))
    skips = 0
    for i, rows in enumerate(minibatches):
        n_tokens = world_sum(int(tokens[rows].sum()), device)
        n_seqs = world_sum(int((tokens[rows] > 0).sum()), device)
        step_sums = MetricSum()  # kept only if the step is applied: metrics describe updates made
        loss_sum = torch.zeros((), device=device)
        shares: dict[tuple[str, str], float] = {}  # (group, name) -> a loss term's total over the micro-batches
        for mb_rows in equalised_micro_batches(rows, lengths, cfg.mb_max_tokens, device):
            picked = mb_rows or rows[:1] or [0]  # an empty (padding) micro-batch reruns one row at weight 0
            loss, stats = micro_loss(batch.select(picked), torch.as_tensor(picked, device=device), n_tokens, n_seqs, i)
            if not mb_rows:
                loss = loss * 0.0  # joins the gradient collective, contributes nothing
            # DDP/FSDP average gradients over ranks; the loss is already a global mean.
            backward(loss * world_size)
            loss_sum = loss_sum + loss.detach()
            for group, values in stats.items():
                for name, (value, over) in values.items():
                    if (group, name) == (prefix, "loss"):
                        continue  # the loss is loss_sum's
                    if over is None:  # a padding micro-batch adds 0: every rank has the same terms to sum
                        shares[group, name] = shares.get((group, name), 0.0) + (float(value) if mb_rows else 0.0)
                    elif mb_rows:
                        step_sums.add({name: value}, float(over), group)
        # The minibatch loss and loss terms over all ranks, in one collective. A loss non-finite on one rank
        # only (gradients need not be) is non-finite in the sum too: every rank skips the step.
        totals = sum_over_ranks(torch.tensor([float(loss_sum), *shares.values()], dtype=torch.float64, device=device))
        minibatch_loss, *share_totals = totals.tolist()
        last = i == len(minibatches) - 1
        grad_norm, applied = optimizer_step(optimizer, model, cfg.optimizer.gradient_clipping,
                                            counts_as_global_step=counts_as_global_step and last,
                                            loss_finite=math.isfinite(minibatch_loss))
        if applied:
            sums.merge(step_sums)
            sums.add({"grad_norm": grad_norm, "loss": minibatch_loss}, 1.0, prefix)
            for (group, name), total in zip(shares, share_totals):
                sums.add({name: total}, 1.0, group)
        else:
            skips += 1
            rank_zero_warn(f"{prefix} optimizer step skipped at policy version {version} (minibatch "
                           f"{i + 1} of {len(minibatches)}): loss {minibatch_loss}, gradient norm "
                           f"{grad_norm}; the weights and optimizer state are unchanged")
    sums.add({"skipped_steps": float(skips)}, 1.0, prefix)
    return skips

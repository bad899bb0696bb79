"""The metrics of an RL iteration: what they are computed from, and how the ranks' values become one.

Each rank computes its metrics over its own rows; the logged value is what one process holding every
rank's rows would compute. Counts and throughput add up over ranks (``SUMMED``); every other metric is
a mean over ranks weighted by what the rank's value averages over: its rows (``ROW_MEANS``), its loss
tokens (``TOKEN_MEANS``), the tokens an update statistic is a mean over (``MetricSum.weights``: the tokens whose
loss counts, or the generated ones), else 1. One all-reduce carries every metric of the iteration.
"""

from __future__ import annotations

import math
import time

import lightning as L
import torch

from lit_ppo.algos import Advantages
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.training.update import MetricSum
from lit_ppo.utils.dist import world_max

SUMMED = ("rollout/accepted", "rollout/rejected", "rollout/invalid_rewards", "rollout/dropped_stale",
          "rollout/drifted_calls", "perf/tokens_per_s")
"""Iteration metrics that add up over ranks (counts, throughput); the others are weighted means."""
ROW_MEANS = ("rollout/reward_mean", "rollout/response_length", "rollout/truncated_fraction")
TOKEN_MEANS = ("actor/advantage_abs_mean", "actor/kl_reward", "critic/explained_variance", "mismatch/logp_abs_diff",
               "rollout/staleness_mean")
"""Iteration metrics that are means over a rank's rows / its loss tokens."""
REWARD_TERMS = "rollout/rewards/"
"""Per reward function of a task that sums several (``RolloutBatch.reward_terms``): ``<name>/mean`` and
``<name>/std`` (sample standard deviation) over the rows where it gave a value, TRL's ``rewards/<name>/...``."""
MISMATCH_STATS = ("behave_imp_weight", "behave_approx_kl", "filtered_fraction")
"""Policy-loss statistics of the behaviour policy vs the proximal policy, logged under mismatch/."""


def staleness(batch: RolloutBatch, version: int) -> dict[str, float]:
    """How many versions the trained tokens lag policy ``version``: their mean on this rank, the
    largest over all ranks."""
    lags = (version - batch.versions[batch.loss_mask.bool()]).float()
    return {"rollout/staleness_mean": float(lags.mean()) if lags.numel() else 0.0,
            "rollout/staleness_max": float(world_max(int(lags.max()) if lags.numel() else 0, batch.input_ids.device))}


def logp_gap(logp: torch.Tensor, batch: RolloutBatch) -> float:
    """The mean |behaviour - ``logp``| log-prob gap over the loss tokens of ``batch``."""
    mask = batch.loss_mask
    return float(((logp - batch.behave_logp).abs() * mask).sum() / mask.sum().clamp(min=1))


def update_metrics(batch: RolloutBatch, adv: Advantages, values: torch.Tensor | None, sums: MetricSum,
                   lr: float) -> tuple[dict[str, float], dict[str, float]]:
    """The metrics of an iteration's update of ``batch`` and the weight of each in the mean over ranks:
    the update statistics in ``sums``, the batch's rewards and lengths, the advantages, the KL reward,
    the actor's learning rate ``lr`` and, with a critic (``values``), the explained variance."""
    mask = batch.loss_mask
    n_tokens = int(mask.sum())
    metrics = sums.means()
    metrics.update({
        "rollout/reward_mean": float(batch.rewards.mean()),
        "rollout/response_length": float(batch.response_lengths.float().mean()),
        "rollout/truncated_fraction": float(batch.truncated.float().mean()),
        "actor/advantage_abs_mean": float((adv.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
        "actor/kl_reward": float(adv.kl_rewards.sum() / mask.sum().clamp(min=1)),
        "actor/lr": lr,
    })
    if values is not None:
        returns = adv.returns[mask]
        metrics["critic/explained_variance"] = float(1 - (returns - values[mask]).var() / returns.var().clamp(min=1e-8))
    weights = {k: float(batch.num_rows) for k in ROW_MEANS}
    for name, values in batch.reward_terms.items():
        given = values[torch.isfinite(values)].double()
        # The std is carried as the mean square until the ranks' values are pooled (log_iteration).
        metrics[f"{REWARD_TERMS}{name}/mean"] = float(given.mean()) if given.numel() else 0.0
        metrics[f"{REWARD_TERMS}{name}/std"] = float(given.square().mean()) if given.numel() else 0.0
        weights[f"{REWARD_TERMS}{name}/mean"] = weights[f"{REWARD_TERMS}{name}/std"] = float(given.numel())
    weights.update({k: float(n_tokens) for k in TOKEN_MEANS})
    weights.update(sums.weights)  # the update's statistics: the tokens each is a mean over
    return metrics, weights


def log_iteration(module: L.LightningModule, metrics: dict[str, float], start: float, n_tokens: int,
                  weights: dict[str, float] | None = None) -> None:
    """Log the iteration's ``metrics``, with its time since ``start`` (``time.perf_counter``) and its
    throughput of ``n_tokens`` loss tokens: one all-reduce for them all, ``SUMMED`` metrics added up
    over ranks, the others means over ranks weighted by ``weights`` (1 where not given)."""
    train_s = time.perf_counter() - start
    metrics["time/train_s"] = train_s
    # The iteration's wall time: generation, or with asynchronous rollouts the wait for the batch.
    waited = metrics.get("time/wait_for_batch_s", metrics.get("time/generate_s", 0.0))
    metrics["perf/tokens_per_s"] = n_tokens / max(train_s + waited, 1e-9)
    names = sorted(metrics)
    w = [1.0 if k in SUMMED else float((weights or {}).get(k, 1.0)) for k in names]
    packed = torch.tensor([float(metrics[k]) * wk for k, wk in zip(names, w)] + w, dtype=torch.float64,
                          device=module.device)
    totals = module.trainer.strategy.reduce(packed, reduce_op="sum").tolist()
    logged = {k: totals[i] if k in SUMMED else totals[i] / max(totals[len(names) + i], 1e-12)
              for i, k in enumerate(names)}
    for i, k in enumerate(names):
        if k.startswith(REWARD_TERMS) and k.endswith("/std"):
            mean_key, count = k.removesuffix("/std") + "/mean", totals[len(names) + i]
            if count == 0:  # the function gave no value in this iteration
                logged[mean_key] = logged[k] = math.nan
            else:
                variance = max(logged[k] - logged[mean_key] ** 2, 0.0) * count / max(count - 1, 1)
                logged[k] = math.sqrt(variance)
    # Lightning takes a logged "step" as the loggers' step: the iteration as the console prints it (else
    # the iteration before, counted from 0).
    logged["step"] = float(module.trainer.global_step)
    # batch_size only silences Lightning's epoch-averaging bookkeeping; nothing is averaged here.
    module.log_dict(logged, on_step=True, on_epoch=False, sync_dist=False, batch_size=1)

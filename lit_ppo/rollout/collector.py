"""One iteration's batch: generate, score, filter, refill, and count what happened.

The collector asks the engine (through the workflow) for ``gconfig.n_samples`` completions of prompts
from the rank's ``PromptStream``, drops the groups holding an invalid reward (``data.on_invalid_reward=drop``),
lets the dynamic filter accept or reject the others whole, and asks for more prompts until the batch
is full: ``data.batch_size`` groups accepted, or with ``data.dynamic_bs`` that many tried. A filter (or
invalid rewards) that keeps the batch from filling stops the run with an error that says which.
Neither Lightning nor a trainer is involved: the data module calls it, on its own thread or the producer's.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import RolloutEngine
from lit_ppo.rollout.episodes.episode import Workflow
from lit_ppo.rollout.stream import PromptStream

INVALID_REWARDS_HINT = ("rewards must be finite real numbers (data.on_invalid_reward=error stops at the first "
                        "invalid one, naming its prompt and value)")


class Collector:
    """Fills one batch per ``collect`` call for rank ``rank`` of ``world``.

    Args:
        engine: samples the completions (woken before a batch, put to sleep after it).
        workflow: turns problems into scored groups through the engine.
        stream: the rank's prompts and request count (advanced by every call).
        rollout: batch size, filter, attempts and seed (``RolloutConfig``).
        accept: the imported ``rollout.dynamic_filter_fn``, None to accept every group.
        rank, world: this rank and the number of ranks, which pick the rank's prompt shard and seeds.
    """

    def __init__(self, engine: RolloutEngine, workflow: Workflow, stream: PromptStream,
                 rollout: RolloutConfig, accept: Callable[[RolloutBatch], bool] | None, rank: int = 0, world: int = 1):
        self.engine = engine
        self.workflow = workflow
        self.stream = stream
        self.rollout = rollout
        self.accept = accept
        self.rank = rank
        self.world = world
        self._empty_in_a_row = 0
        self._tried_in_a_row = 0
        self._invalid_in_a_row = 0
        """Groups tried, and of them dropped for invalid rewards, in the ``_empty_in_a_row`` empty batches."""

    def collect(self) -> RolloutBatch:
        """One iteration's batch: generate, score and filter groups until it is full; its ``metrics``
        count the accepted, rejected and invalid groups and the time it took."""
        cfg = self.rollout
        start = time.perf_counter()
        self.engine.wake()
        accepted: list[RolloutBatch] = []
        tried = rejected = invalid = 0
        counted: dict[str, float] = {}  # what the workflow's runs count (an agent's drifted calls)
        limit = cfg.batch_size * cfg.max_attempts_factor
        while True:
            wanted = cfg.batch_size - (tried if cfg.dynamic_bs else len(accepted))
            if wanted <= 0:
                break
            if not cfg.dynamic_bs and tried >= limit:
                raise self._too_few(len(accepted), tried, invalid)
            seed = self.stream.request_seed(self.rank)
            rollout = self.workflow.run(self.engine, self.stream.take(wanted, self.rank, self.world), seed=seed)
            for name, value in rollout.metrics.items():
                counted[name] = counted.get(name, 0.0) + value
            for g in range(rollout.num_groups):
                group = rollout.select_groups([g])
                tried += 1
                # Only data.on_invalid_reward=drop lets a non-finite reward get here (as NaN); the
                # filter never sees such a group.
                if not bool(torch.isfinite(group.rewards).all()):
                    invalid += 1
                elif self.accept is None or self.accept(group):
                    accepted.append(group)
                else:
                    rejected += 1
        self.engine.sleep()  # frees accelerator memory for the update (where the engine supports it)
        metrics = {"rollout/accepted": float(len(accepted)), "rollout/rejected": float(rejected),
                   "rollout/invalid_rewards": float(invalid),
                   **counted, "time/generate_s": time.perf_counter() - start}
        if not accepted:
            self._count_empty(tried, invalid)
            batch = empty_batch()
        else:
            self._empty_in_a_row = self._tried_in_a_row = self._invalid_in_a_row = 0
            batch = RolloutBatch.concat(accepted, pad_id=self.workflow.pad_id)
        batch.metrics = metrics
        return batch

    def _too_few(self, accepted: int, tried: int, invalid: int) -> RunStopped:
        """The error of a fixed-size batch that did not fill within ``max_attempts_factor * batch_size`` groups."""
        cfg = self.rollout
        shortfall = (f"fewer than data.batch_size={cfg.batch_size} within data.max_attempts_factor="
                     f"{cfg.max_attempts_factor}")
        if self.accept is None or invalid == tried:  # no filter to blame: invalid rewards emptied the batch
            lead = (f"every one of the {tried} groups tried was" if invalid == tried else
                    f"{invalid} of the {tried} groups tried were")
            return RunStopped(f"{lead} dropped for an invalid reward (data.on_invalid_reward=drop), "
                              f"{accepted} accepted, {shortfall}: {INVALID_REWARDS_HINT}")
        dropped = f" ({invalid} dropped for invalid rewards, data.on_invalid_reward=drop)" if invalid else ""
        return RunStopped(f"data.dynamic_filter_fn={cfg.dynamic_filter_fn!r} accepted {accepted} of {tried} groups"
                          f"{dropped}, {shortfall}: loosen the filter, raise the factor, or use data.dynamic_bs=true")

    def _count_empty(self, tried: int, invalid: int) -> None:
        """Count an empty batch (dynamic_bs); RunStopped at ``max_attempts_factor`` of them in a row."""
        cfg = self.rollout
        self._empty_in_a_row += 1
        self._tried_in_a_row += tried
        self._invalid_in_a_row += invalid
        if self._empty_in_a_row < cfg.max_attempts_factor:
            return
        iterations = (f"{self._empty_in_a_row} consecutive iterations (data.max_attempts_factor="
                      f"{cfg.max_attempts_factor}")
        if self._invalid_in_a_row == self._tried_in_a_row:  # no filter to blame
            raise RunStopped(f"every one of the {self._tried_in_a_row} groups tried in {iterations}) was "
                             f"dropped for an invalid reward (data.on_invalid_reward=drop): {INVALID_REWARDS_HINT}")
        dropped = f", the last dropped {invalid} for invalid rewards" if invalid else ""
        raise RunStopped(f"data.dynamic_filter_fn={cfg.dynamic_filter_fn!r} accepted no group in {iterations}"
                         f"{dropped}): loosen the filter")


def empty_batch() -> RolloutBatch:
    """A batch of no rows: what a dynamic-size iteration whose groups were all filtered out trains on."""
    empty_long = torch.zeros(0, 0, dtype=torch.long)
    empty_bool = torch.zeros(0, 0, dtype=torch.bool)
    return RolloutBatch(input_ids=empty_long, attention_mask=empty_bool, loss_mask=empty_bool,
                        behave_logp=torch.zeros(0, 0), versions=empty_long, turn_ids=empty_long,
                        rewards=torch.zeros(0), truncated=torch.zeros(0, dtype=torch.bool),
                        group_sizes=torch.zeros(0, dtype=torch.long))

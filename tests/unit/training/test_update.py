"""lit_ppo.training.update without a Trainer: minibatch and micro-batch splits, the weighted metric sums, the
passes without gradients and the optimizer steps over minibatches (the same update whatever the
micro-batching, non-finite steps skipped)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_ppo.algos import policy_loss
from lit_ppo.config import OptimizerConfig, PPOActorConfig
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.training.optim import adamw_with_schedule
from lit_ppo.training.update import (
    MetricSum,
    balanced_partition,
    equalised_micro_batches,
    micro_batches,
    optimize,
    optimizer_step,
    stitched_passes,
)


def test_balanced_partition_gives_the_heaviest_item_to_the_lightest_part_and_keeps_row_order():
    assert balanced_partition([5, 1, 4, 2, 3], 2) == [[0, 1, 3], [2, 4]]  # loads 8 and 7
    assert balanced_partition([2, 1, 2, 1], 2) == [[0, 1], [2, 3]]
    assert balanced_partition([7], 3) == [[0], [], []]  # more parts than items: empty parts


def test_micro_batches_stay_within_the_padded_token_budget():
    # Rows 0 and 1 pad to 2 x 5 = 10 tokens; adding row 2 would make 3 x 5; row 3 alone is 6.
    assert micro_batches([0, 1, 2, 3], [3, 5, 2, 6], max_tokens=10) == [[0, 1], [2], [3]]
    assert micro_batches([2, 0], [3, 5, 9], max_tokens=4) == [[2], [0]]  # a row over the budget stands alone
    assert micro_batches([], [], max_tokens=4) == []
    # In one process there is no other rank to wait for: no padding micro-batches.
    assert equalised_micro_batches([0, 1, 2, 3], [3, 5, 2, 6], 10, torch.device("cpu")) == [[0, 1], [2], [3]]


def test_metric_sum_weighs_each_statistic_by_its_own_weights():
    sums = MetricSum()
    sums.add({"a": torch.tensor(1.0), "b": 4.0}, weight=3.0, prefix="actor")
    other = MetricSum()
    other.add({"a": 5.0}, weight=1.0, prefix="actor")
    sums.merge(other)
    assert sums.means() == {"actor/a": 2.0, "actor/b": 4.0}  # (1 x 3 + 5 x 1) / 4
    assert sums.weights == {"actor/a": 4.0, "actor/b": 3.0}


def batch_of(values: list[list[float]]) -> RolloutBatch:
    """One prompt token then the generated tokens ``values`` (as behaviour log-probs) per row, right-padded."""
    width = 1 + max(len(v) for v in values)
    rows = len(values)
    attention = torch.zeros(rows, width, dtype=torch.bool)
    logp = torch.zeros(rows, width)
    for r, v in enumerate(values):
        attention[r, :1 + len(v)] = True
        logp[r, 1:1 + len(v)] = torch.tensor(v)
    loss_mask = attention.clone()
    loss_mask[:, 0] = False
    return RolloutBatch(input_ids=torch.ones(rows, width, dtype=torch.long), attention_mask=attention,
                        loss_mask=loss_mask, behave_logp=logp, versions=torch.zeros(rows, width, dtype=torch.long),
                        turn_ids=torch.zeros(rows, width, dtype=torch.long), rewards=torch.zeros(rows),
                        truncated=torch.zeros(rows, dtype=torch.bool), group_sizes=torch.ones(rows, dtype=torch.long))


class Wrapper:
    """What ``optimize`` uses of Lightning's optimizer wrapper; counts the steps that go through it."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.steps = 0

    def step(self):
        self.steps += 1
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)


class Scalar(torch.nn.Module):
    """One weight w; the loss of a token with behaviour log-prob x is w * x."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


def run_update(mb_max_tokens: int, nan_at_minibatch: int | None = None, counts_as_global_step: bool = True):
    """``optimize`` with plain SGD (lr 1) over rows whose generated tokens are 1, 2 | 3 | 4, 5 | 6: the
    minibatches are rows 0, 1 (mean token 2) and rows 2, 3 (mean token 5)."""
    model = Scalar()
    wrapper = Wrapper(torch.optim.SGD(model.parameters(), lr=1.0))
    cfg = PPOActorConfig(ppo_n_minibatches=2, mb_max_tokens=mb_max_tokens,
                         optimizer=OptimizerConfig(gradient_clipping=None))
    seen = []

    def micro_loss(sub, idx, n_tokens, n_seqs, minibatch):
        seen.append((idx.tolist(), n_tokens, n_seqs))
        x = sub.behave_logp * sub.loss_mask
        loss = model.w * x.sum() / n_tokens  # the micro-batch's share of the minibatch's token mean
        if minibatch == nan_at_minibatch:
            loss = loss * math.nan
        generated = sub.loss_mask.sum()
        return loss, {"actor": {"loss": (loss.detach(), None), "x_mean": (x.sum() / generated, generated)}}

    sums = MetricSum()
    skips = optimize(batch_of([[1, 2], [3], [4, 5], [6]]), micro_loss, cfg, prefix="actor", model=model,
                     optimizer=wrapper, counts_as_global_step=counts_as_global_step,
                     backward=lambda loss: loss.backward(), world_size=1, version=7, sums=sums)
    return model, wrapper, sums, skips, seen


def test_optimize_steps_once_per_minibatch_on_its_token_mean_whatever_the_micro_batches():
    for mb_max_tokens in (100, 2):  # all of a minibatch's rows at once, or one row per micro-batch
        model, wrapper, sums, skips, seen = run_update(mb_max_tokens)
        # w: 0 - 2 (first minibatch's mean token) - 5 (the second's)
        assert model.w.item() == -7.0 and skips == 0
        assert wrapper.steps == 1  # only the last step is Lightning's global step
        means = sums.means()
        assert means["actor/loss"] == -5.0  # the minibatch losses 0 (w = 0) and -10 (w = -2 on mean 5)
        assert means["actor/grad_norm"] == 3.5  # |2| and |5|
        assert means["actor/x_mean"] == 3.5  # every token once, weighted by the micro-batch's tokens
        assert means["actor/skipped_steps"] == 0.0
        assert {(n_tokens, n_seqs) for _, n_tokens, n_seqs in seen} == {(3.0, 2.0)}
    assert [rows for rows, _, _ in seen] == [[0], [1], [2], [3]]  # mb_max_tokens=2: one row each


def test_a_non_finite_minibatch_loss_skips_its_step_and_its_metrics():
    with pytest.warns(UserWarning, match=r"^actor optimizer step skipped at policy version 7 \(minibatch 2 of 2\)"):
        model, wrapper, sums, skips, _ = run_update(100, nan_at_minibatch=1)
    assert skips == 1 and model.w.item() == -2.0  # the first step only
    assert wrapper.steps == 1  # the skipped last step still counts the iteration
    means = sums.means()
    assert means["actor/loss"] == 0.0 and means["actor/x_mean"] == 2.0 and means["actor/skipped_steps"] == 1.0
    _, wrapper, _, _, _ = run_update(100, counts_as_global_step=False)
    assert wrapper.steps == 0  # the critic's steps never go through Lightning


def test_optimizer_step_skips_a_non_finite_gradient_and_leaves_adamw_state_alone():
    model = Scalar()
    optimizer, _ = adamw_with_schedule([model.w], OptimizerConfig(lr=0.1), total_steps=0)
    wrapper = Wrapper(optimizer)
    model.w.grad = torch.tensor(math.inf)
    grad_norm, applied = optimizer_step(wrapper, model, 1.0, counts_as_global_step=True, loss_finite=True)
    assert (math.isinf(grad_norm), applied) == (True, False)
    assert model.w.item() == 0.0 and model.w.grad is None and optimizer.state[model.w] == {}
    model.w.grad = torch.tensor(3.0)
    grad_norm, applied = optimizer_step(wrapper, model, 1.0, counts_as_global_step=False, loss_finite=True)
    assert (grad_norm, applied) == (3.0, True)
    assert model.w.item() == pytest.approx(-0.1) and int(optimizer.state[model.w]["step"]) == 1
    assert wrapper.steps == 1  # the first call's
    model.w.grad = torch.tensor(3.0)  # a finite gradient of a loss that was not finite on some rank
    assert optimizer_step(wrapper, model, 1.0, counts_as_global_step=False, loss_finite=False)[1] is False
    assert model.w.item() == pytest.approx(-0.1) and int(optimizer.state[model.w]["step"]) == 1


def test_stitched_passes_put_each_rows_outputs_back_in_place_in_eval_mode():
    batch = batch_of([[1, 2], [3], [4, 5, 6]])
    model = torch.nn.Dropout()
    modes = []

    def fn(sub):
        modes.append(model.training)
        return sub.behave_logp * 10, sub.loss_mask.sum(1).float()

    doubled, lengths = stitched_passes(fn, batch, max_tokens=3, models=[model], every_rank_joins=False)
    assert modes == [False, False, False] and model.training  # eval inside, the mode restored after
    assert torch.equal(doubled, batch.behave_logp * 10)
    assert lengths.tolist() == [2.0, 1.0, 3.0]


def test_each_actor_statistic_is_its_mean_over_its_own_tokens_across_micro_batches():
    """Two micro-batches (one row each) whose high-entropy masks keep 2 of 4 and 3 of 3 generated tokens: every
    statistic is its definition over the tokens it is taken over in the whole batch, computed by hand here, not
    the micro-batches' means weighted by their generated tokens (approx_kl 0.106 then, 0.0747 now)."""
    x = [[0.0, 0.1, 0.6, -0.6], [0.0, 0.05, -0.05]]  # log r = log pi_theta - log pi_old (pi_old: log-prob 0)
    entropies = [[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0]]  # row 0 keeps its top half (3, 4); row 1 all of its tokens
    kept = [[False, False, True, True], [True, True, True]]
    batch = batch_of(x)
    entropy = batch_of(entropies).behave_logp
    model = Scalar()
    wrapper = Wrapper(torch.optim.SGD(model.parameters(), lr=1.0))
    cfg = PPOActorConfig(ppo_n_minibatches=1, mb_max_tokens=5, top_entropy_quantile=0.5, kl_loss_coef=0.1,
                         optimizer=OptimizerConfig(gradient_clipping=None))
    seen = []

    def micro_loss(sub, idx, n_tokens, n_seqs, minibatch):
        seen.append(idx.tolist())
        width = sub.input_ids.shape[1]
        logp = model.w + sub.behave_logp  # log pi_theta = x at w = 0
        loss, stats = policy_loss(logp, torch.zeros_like(logp), sub.loss_mask.float(), sub.loss_mask, cfg,
                                  num_tokens=n_tokens, num_seqs=n_seqs, entropy=entropy[idx, :width],
                                  ref_logp=torch.zeros_like(logp))
        return loss, {"actor": {k: (v, stats.tokens.get(k)) for k, v in stats.items()}}

    sums = MetricSum()
    optimize(batch, micro_loss, cfg, prefix="actor", model=model, optimizer=wrapper, counts_as_global_step=True,
             backward=lambda loss: loss.backward(), world_size=1, version=0, sums=sums)
    assert seen == [[0], [1]]  # rows of 5 and 4 positions in a budget of 5: one micro-batch each
    means = sums.means()

    every = [v for row in x for v in row]
    counted = [v for row, keep in zip(x, kept) for v, k in zip(row, keep) if k]
    k3_ref = [math.exp(-v) - 1 + v for v in every]  # TRL's kl: exp(ref - logp) - (ref - logp) - 1, ref 0
    expected = {
        "actor/approx_kl": sum(math.exp(v) - 1 - v for v in counted) / 5,
        "actor/importance_weight_mean": sum(math.exp(v) for v in counted) / 5,
        "actor/clip_fraction": sum(math.exp(v) > 1.2 for v in counted) / 5,  # 0.6 only: r > 1 + eps, A > 0
        "actor/entropy": sum(v for row in entropies for v in row) / 7,
        "actor/low_entropy_masked_fraction": 2 / 7,
        "actor/kl_ref": sum(k3_ref) / 7,
        "actor/kl_loss": sum(k3_ref) / 7,  # token-mean: the minibatch's shares added up, over all 7 tokens
    }
    for key, value in expected.items():
        assert means[key] == pytest.approx(value, rel=1e-6), key
    assert means["actor/approx_kl"] == pytest.approx(0.074686, abs=1e-6)
    assert sums.weights["actor/approx_kl"] == 5.0 and sums.weights["actor/entropy"] == 7.0
    assert sums.weights["actor/kl_loss"] == 1.0  # one minibatch total

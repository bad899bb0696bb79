"""Evaluation scores (lit_ppo.rollout.evaluation): pass@k, mean@k, accuracy, greedy decoding, by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lit_ppo.config import EvalConfig
from lit_ppo.models.sampling import sampling_logits
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.evaluation import SUMS, Evaluation, eval_metrics, greedy


class ScriptedWorkflow:
    """Returns fixed rewards and completion lengths, problem-major (k per problem)."""

    def __init__(self, rewards: list[float], lengths: list[int]):
        self.rewards, self.lengths = rewards, lengths
        self.calls = []

    def run(self, engine, problems, *, seed=None):
        self.calls.append((list(problems), seed))
        return SimpleNamespace(rewards=torch.tensor(self.rewards), response_lengths=torch.tensor(self.lengths))


def test_scores_add_up_to_accuracy_pass_and_mean_at_k():
    # 3 problems; greedy: correct, wrong (0.1 format credit), correct. k=2 samples each:
    # p0 (1, 0) passes, p1 (0.1, 0.1) fails, p2 (1, 1) passes -> pass@2 = 2/3, mean@2 = 3/6.
    best = ScriptedWorkflow([1.0, 0.1, 1.0], [2, 4, 3])
    sampled = ScriptedWorkflow([1.0, 0.0, 0.1, 0.1, 1.0, 1.0], [1] * 6)
    evaluation = Evaluation(EvalConfig(k=2), best, sampled)
    sums = evaluation.score(engine=None, problems=["a", "b", "c"], seed=7)
    assert dict(zip(SUMS, sums.tolist())) == {"problems": 3, "greedy_correct": 2, "greedy_reward": pytest.approx(2.1),
                                              "greedy_length": 9, "greedy_invalid": 0, "samples_passed": 2,
                                              "samples_correct": 3}
    assert best.calls == [(["a", "b", "c"], 7)] and sampled.calls == [(["a", "b", "c"], 7)]
    metrics = eval_metrics(sums, k=2)
    assert metrics == {"eval/accuracy": pytest.approx(2 / 3), "eval/reward_mean": pytest.approx(0.7),
                       "eval/response_length": 3.0, "eval/problems": 3.0, "eval/pass_at_2": pytest.approx(2 / 3),
                       "eval/mean_at_2": 0.5}


def test_sums_over_batches_equal_one_batch():
    rewards = [1.0, 0.0, 1.0, 1.0]
    whole = Evaluation(EvalConfig(k=0), ScriptedWorkflow(rewards, [1, 2, 3, 4])).score(None, list("abcd"), 0)
    first = Evaluation(EvalConfig(k=0), ScriptedWorkflow(rewards[:1], [1])).score(None, ["a"], 0)
    rest = Evaluation(EvalConfig(k=0), ScriptedWorkflow(rewards[1:], [2, 3, 4])).score(None, list("bcd"), 0)
    assert torch.equal(whole, first + rest)
    assert eval_metrics(whole, k=0) == {"eval/accuracy": 0.75, "eval/reward_mean": 0.75,
                                        "eval/response_length": 2.5, "eval/problems": 4.0}


def test_threshold_and_invalid_rewards():
    # success_threshold 0.5: 0.6 counts; a NaN (data.on_invalid_reward=drop) is wrong and left out of the mean.
    best = ScriptedWorkflow([0.6, float("nan"), 0.2], [1, 1, 1])
    metrics = eval_metrics(Evaluation(EvalConfig(k=0, success_threshold=0.5), best).score(None, list("abc"), 0), k=0)
    assert metrics["eval/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/reward_mean"] == pytest.approx(0.4)
    assert metrics["eval/invalid_rewards"] == 1.0


def test_no_problems_logs_nothing():
    assert eval_metrics(torch.zeros(len(SUMS), dtype=torch.float64), k=4) == {}


def test_greedy_keeps_the_restriction_and_takes_the_argmax():
    params = greedy(SamplingParams(n=8, temperature=0.7, top_k=3, top_p=0.9, allowed_token_ids=[1, 3]))
    assert (params.n, params.temperature, params.top_k, params.top_p, params.allowed_token_ids) == (
        1, 0.0, 0, 1.0, [1, 3])
    logits = torch.tensor([[5.0, 1.0, 0.0, 2.0], [0.0, 3.0, 3.0, 3.0]])
    allowed = torch.tensor([False, True, False, True])
    logp = sampling_logits(logits, temperature=0.0, allowed=allowed).log_softmax(-1)
    # Row 0: token 0 is best but not allowed -> 3; row 1: ties between allowed 1 and 3 -> the first.
    assert logp.argmax(-1).tolist() == [3, 1]
    assert logp.exp().tolist() == [[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="temperature=-1"):
        sampling_logits(logits, temperature=-1)


@pytest.mark.parametrize("field, value, allowed", [
    ("k", -1, "an integer >= 0"),
    ("max_problems", -2, r"an integer >= 0 \(0 disables evaluation\) or null"),
    ("success_threshold", math.inf, "a finite number"),
    ("batch_size", 0, "a positive integer"),
])
def test_eval_config_names_the_key(field, value, allowed):
    with pytest.raises(ValueError, match=rf"eval\.{field}=.* is invalid: must be {allowed}"):
        EvalConfig(**{field: value})

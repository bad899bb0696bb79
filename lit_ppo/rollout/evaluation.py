"""Scoring a task's test problems through the rollout engine that trains on it.

Every problem gets one greedy completion (``eval/accuracy``, ``eval/reward_mean``,
``eval/response_length``) and, with ``eval.k > 0``, k samples from the training sampling
distribution (``eval/pass_at_<k>``: at least one of the k is correct, i.e. the unbiased pass@k
estimator with n = k samples; ``eval/mean_at_<k>``: the fraction of the k that are correct; MLflow
allows no '@' in a metric name). A completion is correct when its reward reaches
``eval.success_threshold``; for a task whose reward sums several functions, when the value of the one
function that decides it (the task's ``accuracy_term``) does, and each function's greedy mean is
logged as ``eval/rewards/<name>/mean``. Each rank scores its own problems into sums, which are added
over ranks before the means are taken, so the metrics do not depend on the world size or the batching.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from lit_ppo.config import EvalConfig
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams

SUMS = ("problems", "greedy_correct", "greedy_reward", "greedy_length", "greedy_invalid", "samples_passed",
        "samples_correct")
"""What ``Evaluation.score`` adds up first, in order (one float64 vector per call)."""


def sum_names(task) -> tuple[str, ...]:
    """Everything ``Evaluation.score`` adds up for ``task``, in order: ``SUMS``, then for each reward function
    of a task that sums several (its ``reward_names``) the sum and the count of its greedy values."""
    return SUMS + tuple(f"{kind}:{name}" for name in getattr(task, "reward_names", ())
                        for kind in ("term_sum", "term_count"))


def greedy(params: SamplingParams) -> SamplingParams:
    """``params`` with one completion per prompt, decoded greedily (within the same allowed tokens)."""
    return replace(params, n=1, temperature=0.0, top_k=0, top_p=1.0)


class Evaluation:
    """Scores test problems with a greedy and a sampled workflow of the same task.

    Args:
        cfg: the evaluation settings.
        greedy_workflow: runs one greedy completion per problem.
        sampled_workflow: runs ``cfg.k`` samples per problem; None when ``cfg.k`` is 0.
    """

    def __init__(self, cfg: EvalConfig, greedy_workflow, sampled_workflow=None):
        self.cfg = cfg
        self.greedy_workflow = greedy_workflow
        self.sampled_workflow = sampled_workflow
        task = getattr(greedy_workflow, "task", None)
        self.reward_names: tuple[str, ...] = tuple(getattr(task, "reward_names", ()))
        self.accuracy_term: str | None = getattr(task, "accuracy_term", None)

    def _correct(self, rollout) -> torch.Tensor:
        """[B] bool: the rows whose deciding value (the ``accuracy_term`` function's, else the reward)
        reaches the threshold; NaN never does."""
        values = rollout.rewards if self.accuracy_term is None else rollout.reward_terms[self.accuracy_term]
        return values.double() >= self.cfg.success_threshold

    def score(self, engine: RolloutEngine, problems: list, seed: int) -> torch.Tensor:
        """The ``sum_names`` sums of ``problems`` (float64). A reward the task could not give (NaN, under
        data.on_invalid_reward=drop) is not correct and is left out of the reward sum."""
        best = self.greedy_workflow.run(engine, problems, seed=seed)
        rewards = best.rewards.double()
        valid = torch.isfinite(rewards)
        sums = [float(len(problems)), float(self._correct(best).sum()), float(rewards[valid].sum()),
                float(best.response_lengths.sum()), float((~valid).sum()), 0.0, 0.0]
        if self.sampled_workflow is not None:
            sampled = self.sampled_workflow.run(engine, problems, seed=seed)
            correct = self._correct(sampled).view(len(problems), self.cfg.k)
            sums[5] = float(correct.any(1).sum())
            sums[6] = float(correct.sum())
        for name in self.reward_names:
            values = best.reward_terms[name].double()
            given = torch.isfinite(values)
            sums += [float(values[given].sum()), float(given.sum())]
        return torch.tensor(sums, dtype=torch.float64)


def eval_metrics(sums: torch.Tensor, k: int, names: tuple[str, ...] = SUMS, prefix: str = "eval") -> dict[str, float]:
    """The logged means of the summed sums ``names`` (``sum_names``, over all batches and ranks); empty
    for no problems."""
    total = dict(zip(names, sums.tolist()))
    n = total["problems"]
    if n == 0:
        return {}
    scored = n - total["greedy_invalid"]
    metrics = {f"{prefix}/accuracy": total["greedy_correct"] / n,
               f"{prefix}/reward_mean": total["greedy_reward"] / scored if scored else float("nan"),
               f"{prefix}/response_length": total["greedy_length"] / n,
               f"{prefix}/problems": n}
    if total["greedy_invalid"]:
        metrics[f"{prefix}/invalid_rewards"] = total["greedy_invalid"]
    if k > 0:
        metrics[f"{prefix}/pass_at_{k}"] = total["samples_passed"] / n
        metrics[f"{prefix}/mean_at_{k}"] = total["samples_correct"] / (n * k)
    for name in names[len(SUMS):]:
        kind, term = name.split(":", 1)
        if kind == "term_sum":
            count = total[f"term_count:{term}"]
            metrics[f"{prefix}/rewards/{term}/mean"] = total[name] / count if count else float("nan")
    return metrics

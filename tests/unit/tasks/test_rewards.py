"""Reward functions are called as TRL calls them (keywords, completion_ids, trainer_state, chat messages),
TRL's own ``trl.rewards`` run unchanged, each function's values are kept, and evaluation's "solved" is
one named function's value, never the sum."""

from __future__ import annotations

import json
import math
import signal
import statistics
from types import SimpleNamespace

import pytest
import torch
from trl.rewards import (
    accuracy_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)

from lit_ppo.config import EvalConfig, RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.rollout.evaluation import Evaluation, eval_metrics, greedy
from lit_ppo.tasks import DatasetTask
from lit_ppo.training.metrics import log_iteration

HERE = __name__
overlong = get_soft_overlong_punishment(max_completion_len=4, soft_punish_cache=2)
repetition = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
SEEN: list[dict] = []


def format_reward(completions, **kwargs):
    """TRL's usual shape: one positional parameter, everything else by keyword."""
    return [1.0 if "\\boxed{" in c[0]["content"] else 0.0 for c in completions]


def positional(p, c):
    return [0.0] * len(c)


async def slow_length(completions, completion_ids, **kwargs):
    SEEN.append(kwargs)
    return [float(len(ids)) for ids in completion_ids]


def interrupts(completions, **kwargs):
    raise KeyboardInterrupt


def boxed_correct(completions, solution, **kwargs):
    """1.0 where the \\boxed{} answer is the solution."""
    return [float(f"\\boxed{{{s}}}" in (c if isinstance(c, str) else c[0]["content"]))
            for c, s in zip(completions, solution)]


def chat_rows(solutions):
    return [{"prompt": [{"role": "system", "content": "Think, then box."}, {"role": "user", "content": f"q{i}"}],
             "solution": s} for i, s in enumerate(solutions)]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_trl_reward_functions_get_what_trl_gives_them(tmp_path):
    fns = ["trl.rewards.accuracy_reward", "trl.rewards.think_format_reward", f"{HERE}.overlong",
           f"{HERE}.repetition", "trl.rewards.reasoning_accuracy_reward", f"{HERE}.format_reward"]
    weights = [1.0, 0.5, 1.0, 0.25, 2.0, 1.0]
    task = DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows([r"\frac{1}{3}", "no gold here"])),
                       reward_fns=fns, reward_weights=weights)
    assert task.reward_names == ("accuracy_reward", "think_format_reward", "soft_overlong_punishment_reward",
                                 "repetition_penalty_reward", "reasoning_accuracy_reward", "format_reward")
    texts = [r"<think>a third</think> \boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}", "<think>x y x y x y"]
    ids = [[5, 6, 7], [5, 6, 7, 8, 9], [1, 2, 1, 2, 1, 2]]
    for problem in task.problems("train"):
        scores = task.score_group(problem, texts, ids, step=7)
        # What TRL's trainer hands each function: chat completions, every column but the prompt, the ids.
        trl_kwargs = dict(prompts=[list(problem.messages)] * 3,
                          completions=[[{"role": "assistant", "content": t}] for t in texts],
                          completion_ids=ids, solution=[problem.columns["solution"]] * 3)
        direct = [accuracy_reward(**trl_kwargs), think_format_reward(**trl_kwargs), overlong(**trl_kwargs),
                  repetition(**trl_kwargs), reasoning_accuracy_reward(**trl_kwargs), format_reward(**trl_kwargs)]
        expected_terms = [[math.nan if v is None else float(v) for v in values] for values in direct]
        for name, values in zip(task.reward_names, expected_terms):
            assert scores.terms[name] == pytest.approx(values, nan_ok=True), name
        expected_sums = [sum(w * v for w, v in zip(weights, column) if not math.isnan(v))
                         for column in zip(*expected_terms)]
        assert scores.rewards == pytest.approx(expected_sums)
    # The values themselves, known by hand for the first problem.
    first = task.score_group(task.problems("train")[0], texts, ids, step=7)
    assert first.terms["accuracy_reward"] == [1.0, 0.0, 0.0]
    assert first.terms["think_format_reward"] == [1.0, 0.0, 0.0]
    # 3 tokens: 1 into the soft cache of 2 ((4 - 2 - 3) / 2); 5 and 6: over the 4 allowed.
    assert first.terms["soft_overlong_punishment_reward"] == [-0.5, -1.0, -1.0]
    assert first.terms["format_reward"] == [1.0, 1.0, 0.0]
    # An unparseable gold answer: accuracy_reward returns None (not applicable), left out of the sum.
    second = task.score_group(task.problems("train")[1], texts, ids, step=7)
    assert math.isnan(second.terms["accuracy_reward"][0])


def test_completion_ids_and_trainer_state_and_async_functions(tmp_path):
    SEEN.clear()
    task = DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows(["1"])),
                       reward_fns=[f"{HERE}.slow_length", f"{HERE}.format_reward"])
    scores = task.score_group(task.problems("train")[0], ["a", "\\boxed{1}"], [[4, 5, 6], [7]], step=12)
    assert scores.terms == {"slow_length": [3.0, 1.0], "format_reward": [0.0, 1.0]}
    assert scores.rewards == [3.0, 2.0]
    (kwargs,) = SEEN
    assert kwargs["trainer_state"].global_step == 12 and kwargs["solution"] == ["1", "1"]
    assert kwargs["prompts"][0][-1] == {"role": "user", "content": "q0"}


def test_the_workflow_passes_the_token_ids_and_the_version_that_sampled_them(tmp_path):
    SEEN.clear()
    task = DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows(["1"])),
                       reward_fns=[f"{HERE}.slow_length"])

    class Engine:
        def generate(self, prompts, params):
            return [[Completion(token_ids=[3] * (k + 1), logprobs=[-0.5] * (k + 1), stopped=True, version=4)
                     for k in range(params.n)] for _ in prompts]

    batch = SingleTurnWorkflow(DigitTokenizer(), task, SamplingParams(n=3, max_new_tokens=3), RolloutConfig()).run(
        Engine(), list(task.problems("train")))
    assert SEEN[0]["trainer_state"].global_step == 4
    assert batch.rewards.tolist() == [1.0, 2.0, 3.0]
    assert batch.reward_terms["slow_length"].tolist() == [1.0, 2.0, 3.0]


def test_a_function_that_cannot_take_the_keywords_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows(["1"])),
                    reward_fns=[f"{HERE}.format_reward", f"{HERE}.positional"])
    assert str(e.value) == (
        f"data.task_kwargs.reward_fns[1]='{HERE}.positional': positional(p, c) cannot take the keywords reward "
        f"functions are called with (prompts, completions, completion_ids, trainer_state, solution): missing a "
        f"required argument: 'p'; name its parameters after them and end with **kwargs, e.g. "
        f"def positional(completions, **kwargs)")


def test_a_keyboard_interrupt_raised_by_a_reward_names_it(tmp_path):
    task = DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows(["1"])),
                       reward_fns=[f"{HERE}.interrupts"])
    problem = task.problems("train")[0]
    previous = signal.signal(signal.SIGINT, lambda *args: None)  # as during a fit: Ctrl-C is lit_ppo's
    try:
        with pytest.raises(RunStopped) as e:
            task.score_group(problem, ["x"], [[1]], step=0)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert str(e.value).startswith(f"reward function '{HERE}.interrupts' raised KeyboardInterrupt for prompt "
                                   f"[{{'role': 'system'")
    # Under Python's own SIGINT handler it may be a real Ctrl-C: it goes on as one. The handler is set here:
    # an earlier test in this worker may have left another one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            task.score_group(problem, ["x"], [[1]], step=0)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_answer_column_is_needed_only_by_the_builtins_that_compare_with_it(tmp_path):
    path = write_rows(tmp_path / "chat.jsonl", chat_rows(["1", "2"]))
    task = DatasetTask(train_path=path, reward_fns=[f"{HERE}.boxed_correct"])
    assert task.reward(task.problems("train")[1], "\\boxed{2}") == 1.0
    with pytest.raises(ValueError) as e:
        DatasetTask(train_path=path, reward_fns=[f"{HERE}.boxed_correct", "math_verify"])
    assert str(e.value) == (f"data.task_kwargs.answer_key='answer': {path} has no column 'answer', which the reward "
                            f"'math_verify' compares with; columns: prompt, solution")


@pytest.mark.parametrize("fns,accuracy,expected", [
    (["format"], None, "format"),
    (["format", f"{HERE}.boxed_correct", f"{HERE}.slow_length"], None, "boxed_correct"),
    (["format", f"{HERE}.boxed_correct", f"{HERE}.slow_length"], "slow_length", "slow_length"),
    (["format", f"{HERE}.boxed_correct"], f"{HERE}.boxed_correct", "boxed_correct"),
    (["format", f"{HERE}.format_reward"], None,
     "data.task_kwargs.accuracy_reward is needed: every reward function is a format reward (format, format_reward); "
     "name the one whose value decides what evaluation counts as solved"),
    (["format", f"{HERE}.boxed_correct"], "correct",
     "data.task_kwargs.accuracy_reward='correct' is not one of the reward functions: allowed: format, boxed_correct"),
])
def test_which_reward_decides_solved(tmp_path, fns, accuracy, expected):
    path = write_rows(tmp_path / "chat.jsonl", chat_rows(["1"]))
    if expected.startswith("data."):
        with pytest.raises(ValueError) as e:
            DatasetTask(train_path=path, reward_fns=fns, accuracy_reward=accuracy)
        assert str(e.value) == expected
    else:
        assert DatasetTask(train_path=path, reward_fns=fns, accuracy_reward=accuracy).accuracy_term == expected


class DigitTokenizer:
    """Token k decodes to COMPLETIONS[k] (3: "x" for any other test)."""

    pad_token_id, eos_token_id = 0, 1

    def apply_chat_template(self, messages, **kwargs):
        return [2]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(COMPLETIONS.get(i, "x") for i in ids)


SOLUTIONS = [str(10 + i) for i in range(8)]
COMPLETIONS = {100 + i: text for i, text in enumerate(
    [f"\\boxed{{{SOLUTIONS[0]}}}", f"\\boxed{{{SOLUTIONS[1]}}}", f"\\boxed{{{SOLUTIONS[2]}}}",
     f"\\boxed{{{SOLUTIONS[3]}}}", "\\boxed{99}", "\\boxed{98}", SOLUTIONS[6], "no idea"])}
"""Problem i's one completion (token 100 + i): 4 formatted and right, 2 formatted and wrong, 2 unformatted."""


class FixedEngine:
    """Problem i (its prompt's user message q<i>) always gets the completion token 100 + i."""

    def __init__(self, problems):
        self.problems = problems
        self.calls = 0

    def generate(self, prompts, params):
        start, self.calls = self.calls, self.calls + len(prompts)
        return [[Completion(token_ids=[100 + (start + j) % 8], logprobs=[-0.1], stopped=True, version=0)] * params.n
                for j in range(len(prompts))]


def test_accuracy_is_the_named_reward_not_the_sum(tmp_path):
    from lit_ppo.rollout.evaluation import sum_names

    task = DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows(SOLUTIONS)),
                       reward_fns=["format", f"{HERE}.boxed_correct"])
    problems = list(task.problems("train"))
    formatted = [COMPLETIONS[100 + i].startswith("\\boxed{") for i in range(8)]
    right = [COMPLETIONS[100 + i] == f"\\boxed{{{SOLUTIONS[i]}}}" for i in range(8)]
    params = SamplingParams(n=2, max_new_tokens=1)
    evaluation = Evaluation(EvalConfig(k=2),
                            SingleTurnWorkflow(DigitTokenizer(), task, greedy(params), RolloutConfig()),
                            SingleTurnWorkflow(DigitTokenizer(), task, params, RolloutConfig()))
    engine = FixedEngine(problems)
    sums = evaluation.score(engine, problems, seed=0)
    metrics = eval_metrics(sums, k=2, names=sum_names(task))
    assert metrics["eval/accuracy"] == sum(right) / 8 == 0.5  # the sum reaches 1.0 for 6 of the 8
    assert metrics["eval/pass_at_2"] == metrics["eval/mean_at_2"] == 0.5
    assert metrics["eval/rewards/format/mean"] == sum(formatted) / 8
    assert metrics["eval/rewards/boxed_correct/mean"] == sum(right) / 8
    assert metrics["eval/reward_mean"] == (sum(formatted) + sum(right)) / 8


def test_each_reward_function_is_logged_as_trl_logs_it():
    values = torch.tensor([1.0, math.nan, 0.0, 1.0])
    batch = RolloutBatch(input_ids=torch.ones(4, 2, dtype=torch.long),
                         attention_mask=torch.ones(4, 2, dtype=torch.bool),
                         loss_mask=torch.ones(4, 2, dtype=torch.bool), behave_logp=torch.zeros(4, 2),
                         versions=torch.zeros(4, 2, dtype=torch.long), turn_ids=torch.zeros(4, 2, dtype=torch.long),
                         rewards=torch.tensor([2.0, 0.5, 0.0, 1.5]), truncated=torch.zeros(4, dtype=torch.bool),
                         group_sizes=torch.tensor([2, 2]),
                         reward_terms={"correct": values, "never": torch.full((4,), math.nan)})
    from lit_ppo.training.metrics import update_metrics
    from lit_ppo.training.update import MetricSum

    adv = SimpleNamespace(advantages=torch.zeros(4, 2), kl_rewards=torch.zeros(4, 2), returns=torch.zeros(4, 2))
    metrics, weights = update_metrics(batch, adv, None, MetricSum(), lr=1e-3)
    logged: dict = {}
    module = SimpleNamespace(device="cpu", trainer=SimpleNamespace(
        global_step=1, strategy=SimpleNamespace(reduce=lambda t, reduce_op: t)),
        log_dict=lambda d, **kwargs: logged.update(d))
    log_iteration(module, metrics, start=0.0, n_tokens=8, weights=weights)
    assert logged["rollout/rewards/correct/mean"] == pytest.approx(2 / 3)
    assert logged["rollout/rewards/correct/std"] == pytest.approx(statistics.stdev([1.0, 0.0, 1.0]))
    assert math.isnan(logged["rollout/rewards/never/mean"]) and math.isnan(logged["rollout/rewards/never/std"])


IN_FLIGHT = {"now": 0, "most": 0, "calls": 0}


async def slow_judge(completions, **kwargs):
    """An asynchronous reward that takes a while per call (a judge, a remote service): counts how many of its
    calls are awaited at once."""
    import asyncio

    IN_FLIGHT["now"] += 1
    IN_FLIGHT["calls"] += 1
    IN_FLIGHT["most"] = max(IN_FLIGHT["most"], IN_FLIGHT["now"])
    await asyncio.sleep(0.05)
    IN_FLIGHT["now"] -= 1
    return [float(len(c[0]["content"])) for c in completions]


async def hangs(completions, **kwargs):
    import asyncio

    await asyncio.sleep(30)


async def times_out_itself(completions, **kwargs):
    raise TimeoutError("the judge did not answer")


def judge_task(tmp_path, fns, **kwargs) -> DatasetTask:
    return DatasetTask(train_path=write_rows(tmp_path / "chat.jsonl", chat_rows([str(i) for i in range(8)])),
                       reward_fns=fns, **kwargs)


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_a_batch_s_asynchronous_reward_calls_are_awaited_together_within_the_limit(tmp_path, limit):
    IN_FLIGHT.update(now=0, most=0, calls=0)
    task = judge_task(tmp_path, [f"{HERE}.slow_judge", f"{HERE}.format_reward"], reward_concurrency=limit)
    problems = list(task.problems("train"))
    texts = [["ab", "\\boxed{1}"] for _ in problems]
    scores = task.score_groups(problems, texts, [[[1], [2]] for _ in problems], step=3)
    assert IN_FLIGHT["calls"] == 8 and IN_FLIGHT["most"] == limit  # one call per group, `limit` at once
    assert [s.rewards for s in scores] == [[2.0, 10.0]] * 8  # the sum of the judge's length and the format
    # One group through the workflow-facing single call gives the same.
    assert task.score_group(problems[0], texts[0], [[1], [2]], step=3).rewards == [2.0, 10.0]


def test_a_reward_call_past_the_timeout_stops_the_run_in_one_line(tmp_path):
    import time

    task = judge_task(tmp_path, [f"{HERE}.hangs"], reward_timeout_s=0.2)
    problems = list(task.problems("train"))
    started = time.monotonic()
    with pytest.raises(RunStopped) as stopped:
        task.score_groups(problems, [["a"]] * 8, [[[1]]] * 8, step=0)
    assert time.monotonic() - started < 5
    message = str(stopped.value)
    assert message.startswith(f"reward function '{HERE}.hangs' took more than 0.2 s for prompt ")
    assert message.endswith(": make it faster or raise data.task_kwargs.reward_timeout_s") and "\n" not in message
    # A function's own TimeoutError is its error, not the limit's.
    task = judge_task(tmp_path, [f"{HERE}.times_out_itself"], reward_timeout_s=10)
    with pytest.raises(RunStopped, match=f"reward function '{HERE}.times_out_itself' raised TimeoutError: the judge "
                                         f"did not answer for prompt "):
        task.score_groups(problems[:1], [["a"]], [[[1]]], step=0)


def test_a_failing_synchronous_reward_leaves_no_asynchronous_call_unawaited(tmp_path):
    import gc
    import warnings

    task = judge_task(tmp_path, [f"{HERE}.slow_judge", f"{HERE}.positional_raises"])
    problems = list(task.problems("train"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RunStopped, match="reward function .*positional_raises' raised ValueError: no"):
            task.score_groups(problems, [["a"]] * 8, [[[1]]] * 8, step=0)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


def positional_raises(completions, **kwargs):
    raise ValueError("no")


@pytest.mark.parametrize("key, value, expected", [
    ("reward_concurrency", 0, "data.task_kwargs.reward_concurrency=0 is invalid: must be a positive integer"),
    ("reward_timeout_s", 0, "data.task_kwargs.reward_timeout_s=0 is invalid: must be a number of seconds > 0 or null"),
    ("reward_timeout_s", "1", "data.task_kwargs.reward_timeout_s='1' is invalid: must be a number of seconds > 0"),
])
def test_bad_concurrency_settings_fail_in_one_line(tmp_path, key, value, expected):
    with pytest.raises(ValueError) as error:
        judge_task(tmp_path, ["exact_match"], **{key: value})
    assert str(error.value).startswith(expected)


def test_the_single_turn_workflow_scores_the_batch_s_groups_at_once(tmp_path):
    IN_FLIGHT.update(now=0, most=0, calls=0)
    task = judge_task(tmp_path, [f"{HERE}.slow_judge"])

    class Engine:
        def generate(self, prompts, params):
            return [[Completion(token_ids=[3], logprobs=[-0.5], stopped=True, version=0)] * params.n for _ in prompts]

    batch = SingleTurnWorkflow(DigitTokenizer(), task, SamplingParams(n=2, max_new_tokens=3), RolloutConfig()).run(
        Engine(), list(task.problems("train")))
    assert IN_FLIGHT["calls"] == 8 and IN_FLIGHT["most"] == 8 and batch.group_sizes.tolist() == [2] * 8

"""Reasoning-gym tasks (``lit_ppo.tasks.reasoning_gym``): gsm_symbolic's prompts and reward, seeded splits,
any reasoning-gym dataset, and config errors."""

from __future__ import annotations

import re

import pytest

from lit_ppo.tasks import ReasoningGymTask
from lit_ppo.tasks.base import Problem, Task
from tests.unit.tasks.helpers import char_tokenizer


@pytest.fixture(scope="module")
def gsm_symbolic():
    return ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=3, test_size=5)


def test_gsm_symbolic_protocol_and_prompts(gsm_symbolic):
    assert isinstance(gsm_symbolic, Task) and gsm_symbolic.name == "gsm_symbolic"
    assert gsm_symbolic.allowed_completion_tokens(char_tokenizer()) is None
    assert len(gsm_symbolic.problems("train")) == 20 and len(gsm_symbolic.problems("test")) == 5
    for p in gsm_symbolic.problems("train"):
        assert "<answer>" in p.prompt and "</answer>" in p.prompt  # the format instruction
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.answer  # gsm_symbolic golds are numbers


def test_gsm_symbolic_reward(gsm_symbolic):
    for split in ("train", "test"):
        for p in gsm_symbolic.problems(split):
            assert gsm_symbolic.reward(p, f"Some steps.\n<answer>{p.answer}</answer>") == 1.0
            assert gsm_symbolic.reward(p, f"<answer> {p.answer} </answer>") == 1.0
    p = gsm_symbolic.problems("train")[0]
    wrong = str(int(float(p.answer)) + 1)
    assert gsm_symbolic.reward(p, f"<answer>{wrong}</answer>") < 0.1  # dataset's own scale: 0.01
    assert gsm_symbolic.reward(p, "<answer>no idea</answer>") == 0.0
    assert gsm_symbolic.reward(p, f"The answer is {p.answer}.") == 0.0  # no tags: nothing extracted
    assert gsm_symbolic.reward(p, "") == 0.0
    # the last answer tag counts, as in reasoning-gym's extract_answer
    assert gsm_symbolic.reward(p, f"<answer>{wrong}</answer> no, <answer>{p.answer}</answer>") == 1.0
    assert gsm_symbolic.reward(p, f"<answer>{p.answer}</answer> no, <answer>{wrong}</answer>") < 0.1


def test_gsm_symbolic_deterministic_per_seed(gsm_symbolic):
    same = ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=3, test_size=5)
    other = ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=4, test_size=5)
    assert same.problems("train") == gsm_symbolic.problems("train")
    assert same.problems("test") == gsm_symbolic.problems("test")
    assert other.problems("train") != gsm_symbolic.problems("train")
    assert not set(gsm_symbolic.problems("test")) & set(gsm_symbolic.problems("train"))


def test_reasoning_gym_reward_needs_own_problem(gsm_symbolic):
    with pytest.raises(ValueError, match="not one of this task"):
        gsm_symbolic.reward(Problem("What is 1+1?", "2"), "<answer>2</answer>")


def test_reasoning_gym_any_dataset():
    task = ReasoningGymTask(dataset="basic_arithmetic", size=10, seed=0, test_size=10,
                            dataset_kwargs={"min_terms": 2, "max_terms": 2})
    assert task.name == "basic_arithmetic"
    # this generator seeds entry i with seed + i: a test seed of seed + 1 would repeat 9 of 10
    assert not set(task.problems("test")) & set(task.problems("train"))
    assert ReasoningGymTask(dataset="basic_arithmetic", size=10, test_size=0).problems("test") == ()
    for p in task.problems("train"):
        assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0
        assert task.reward(p, "<answer>x</answer>") == 0.0


SMALL_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
"""chain_sum of two one-digit numbers: few distinct questions, so the test seed's entries repeat training ones."""


def test_the_test_split_is_held_out_even_where_the_generator_repeats_itself():
    task = ReasoningGymTask(dataset="chain_sum", size=100, seed=0, test_size=30, dataset_kwargs=SMALL_SUMS)
    train, test = task.problems("train"), task.problems("test")
    raw = task._generate(task._split_seed("test"), 30)  # what the test seed gives, repeats included
    assert {p.prompt for p in raw} & {p.prompt for p in train}  # the generator does repeat training questions
    assert len(test) == 30 == len({p.prompt for p in test})
    assert not {p.prompt for p in test} & {p.prompt for p in train}
    # The first new questions of the test seed, in order: a larger test split starts with the smaller one.
    larger = ReasoningGymTask(dataset="chain_sum", size=100, seed=0, test_size=40, dataset_kwargs=SMALL_SUMS)
    assert larger.problems("test")[:30] == test
    with pytest.raises(ValueError, match=r"^test_size=200 is invalid for reasoning-gym dataset 'chain_sum' .*: 12800 "
                                         r"entries gave \d+ problems that are not training ones and not repeated; "
                                         r"lower test_size or size"):
        ReasoningGymTask(dataset="chain_sum", size=100, seed=0, test_size=200, dataset_kwargs=SMALL_SUMS)


def test_reasoning_gym_config_errors():
    with pytest.raises(ValueError, match="gsm_symbolic") as err:  # close match suggested
        ReasoningGymTask(dataset="gsm_symbolc")
    assert "available" in str(err.value)
    with pytest.raises(ValueError, match="basic_arithmetic"):
        ReasoningGymTask(dataset="basic_arithmetic", dataset_kwargs={"no_such_field": 1})
    with pytest.raises(ValueError, match="prompt_style"):
        ReasoningGymTask(dataset="gsm_symbolic", prompt_style="nope")

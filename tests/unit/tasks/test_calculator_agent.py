"""The calculator task as an OpenAI-tools agent (lit_ppo.tasks.calculator_agent), on the chat client with a
SmolLM2-like ChatML template (no tools in it: the json tool-call format) and scripted replies: the tool's
replies, the reward of each kind of episode, and the one token sequence an episode trains on."""

from __future__ import annotations

import pytest

from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.calculator_agent import TOOL_CREDIT, calculate, final_number, solve
from tests.unit.rollout.episodes.test_chat_client import CHATML, IM_START, client_of

PROBLEM = Problem("What is 964*59?", "56876")
CALL = '{"name": "calculator", "arguments": {"expression": "964*59"}}'


@pytest.mark.parametrize("arguments, expected", [
    ('{"expression": "964*59"}', "56876"),
    ('{"expression": "7/2"}', "7/2"),
    ('{"expression": "1/0"}', "error: division by zero"),
    ('{"expression": 964}', "error: give the expression as a string"),
    ('{"expression": "__import__(\'os\')"}', "error: expected a number at position 0"),
    ("[1]", "error: 'list' object has no attribute 'get'"),
])
def test_the_calculator_evaluates_safely_and_answers_errors_in_words(arguments, expected):
    assert calculate(arguments) == expected


def test_the_final_number_is_the_last_integer_of_the_reply():
    assert final_number("56,876") == "56876" and final_number("964*59 = 56876.") == "56876"
    assert final_number("no idea") is None


@pytest.mark.parametrize("replies, reward", [
    ([CALL, "56876"], 1.0),  # the tool, then the right answer
    (["56876"], 1.0),  # right without the tool
    ([CALL, "56000"], TOOL_CREDIT),  # a result from the tool, a wrong answer
    (['{"name": "calculator", "arguments": {"expression": "9+"}}', "1"], 0.0),  # the tool said error
    (["56000"], 0.0),
    ([CALL, CALL, CALL], TOOL_CREDIT),  # three calls and no answer
])
def test_the_reward_is_the_calculator_task_s(replies, reward):
    client, engine, tok = client_of(CHATML, *replies)
    assert solve(client, PROBLEM) == reward
    assert len(engine.prompts) == len(replies)
    (episode,) = client.episodes()  # every call continued one token sequence
    assert sum(segment.generated for segment in episode.segments) == len(replies)


def test_the_prompt_announces_the_tool_and_shows_the_worked_example():
    client, engine, tok = client_of(CHATML, CALL, "56876")
    solve(client, PROBLEM)
    first = tok.decode(engine.prompts[0][0])
    assert first.startswith(f"{IM_START}system\nYou can call these functions:\n") and '"name": "calculator"' in first
    assert 'What is 415*27?' in first and '{"name": "calculator", "arguments": {"expression": "415*27"}}' in first
    # SmolLM2's template renders any role: the results come back in tool turns.
    assert f"{IM_START}tool\n11205" in first and first.endswith(f"What is 964*59?<|im_end|>\n{IM_START}assistant\n")
    assert tok.decode(engine.prompts[1][0]).endswith(f"{IM_START}tool\n56876<|im_end|>\n{IM_START}assistant\n")

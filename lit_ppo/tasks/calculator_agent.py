"""The calculator task as an agent of the OpenAI API: the same problems (``lit_ppo.tasks.calculator``), but
the policy calls a ``calculator`` tool through ``tools`` / ``tool_calls`` in its model family's own format
(``lit_ppo.rollout.episodes.tool_calls``), as an agent written for the ``openai`` SDK lets a model do. One worked
example in the conversation shows the model the call; the reward is the calculator task's: 1.0 for the
right answer, ``TOOL_CREDIT`` for an episode that did not answer right but got a result from the tool.
``recipe=smollm2_calculator_agent`` trains SmolLM2 with it (docs/agents.md).
"""

from __future__ import annotations

import json
import re

from lit_ppo.tasks.calculator import CalculatorError, format_number, safe_eval

CALCULATOR = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression of integers with + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 415*27"}},
                   "required": ["expression"]}}}
"""The tool, as the OpenAI API declares one."""
INSTRUCTIONS = "Use the calculator tool for arithmetic, then answer with the number alone."
EXAMPLE = [
    {"role": "user", "content": "What is 415*27?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_example", "type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"expression": "415*27"})}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": "11205"},
    {"role": "assistant", "content": "11205"},
]
"""A worked example before the problem: a call, its result, the answer."""
MAX_CALLS = 3
"""Calls per episode: a tool call, the answer, and one more of either."""
TOOL_CREDIT = 0.1
"""Reward of an episode without the right answer whose tool call returned a result (the calculator task's)."""


def calculate(arguments: str) -> str:
    """The calculator's reply to a call's JSON arguments: the value, or ``error: ...``."""
    try:
        expression = json.loads(arguments).get("expression")
        if not isinstance(expression, str):
            return "error: give the expression as a string"
        return format_number(safe_eval(expression))
    except (json.JSONDecodeError, AttributeError, CalculatorError) as e:
        return f"error: {e}"


def final_number(text: str) -> str | None:
    """The last integer of a reply (thousands separators dropped), or None."""
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None


def solve(client, problem) -> float:
    """Answer ``problem`` with the calculator tool at hand; the calculator task's reward."""
    messages = [{"role": "system", "content": INSTRUCTIONS}, *EXAMPLE, {"role": "user", "content": problem.prompt}]
    got_result = False
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        if not message.tool_calls:
            if final_number(message.content or "") == problem.answer:
                return 1.0
            break
        messages.append(message)
        for call in message.tool_calls:
            result = calculate(call.function.arguments)
            got_result |= not result.startswith("error")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return TOOL_CREDIT if got_result else 0.0

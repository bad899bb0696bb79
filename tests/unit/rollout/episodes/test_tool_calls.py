"""Tool calls in the model's words (lit_ppo.rollout.episodes.tool_calls): each format parsed and written back, a
malformed call read as plain content, the format detected from the chat template."""

from __future__ import annotations

import json

import pytest

from lit_ppo.rollout.episodes.tool_calls import (
    Reply,
    detect_format,
    parse_reply,
    render_calls,
    render_result,
    render_tools,
)

TOOLS = {"calc", "search"}


def test_hermes_calls_and_the_text_around_them():
    text = ('Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"q": "\u00e9t\u00e9"}}</tool_call><|im_end|>')
    reply = parse_reply(text.removesuffix("<|im_end|>"), "hermes", TOOLS)
    assert reply == Reply("Let me compute.", (("calc", '{"expression": "12*7"}'), ("search", '{"q": "\u00e9t\u00e9"}')))


def test_json_calls_one_a_list_parameters_and_a_fence():
    assert parse_reply(' {"name": "calc", "parameters": {"expression": "1+1"}} ', "json", TOOLS) == Reply(
        None, (("calc", '{"expression": "1+1"}'),))
    both = '[{"name": "calc", "arguments": {"expression": "2"}}, {"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}]'
    assert parse_reply(both, "json", TOOLS).calls == (("calc", '{"expression": "2"}'), ("search", '{"q": "x"}'))
    fenced = '```json\n{"name": "search", "arguments": {}}\n```'
    assert parse_reply(fenced, "json", TOOLS) == Reply(None, (("search", "{}"),))


@pytest.mark.parametrize("fmt,text", [
    ("hermes", '<tool_call>{"name": "calc", "arguments": {"expression": "1+</tool_call>'),  # broken JSON
    ("hermes", 'So: <tool_call>{"name": "calc", "arguments": {}}'),  # never closed (truncated)
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'),  # a tool that was not offered
    ("hermes", '<tool_call>{"name": "calc", "arguments": [1, 2]}</tool_call>'),  # arguments not an object
    ("hermes", '<tool_call>{"name": "calc"}</tool_call> and </tool_call>'),  # a stray closing tag
    ("json", '{"name": "calc", "arguments": {"expression": "1"}'),  # broken JSON
    ("json", '{"answer": 42}'),  # JSON, but no call
    ("json", "The answer is 42."),
])
def test_anything_else_is_plain_content(fmt, text):
    assert parse_reply(text, fmt, TOOLS) == Reply(text.strip(), ())


def test_without_tools_a_call_is_content():
    text = '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
    assert parse_reply(text, "hermes", set()) == Reply(text, ())
    assert parse_reply("  ", "json", TOOLS) == Reply(None, ())


@pytest.mark.parametrize("fmt", ["hermes", "json"])
def test_written_calls_parse_back(fmt):
    calls = [("calc", '{"expression": "12*7"}'), ("search", '{"q": "caf\u00e9"}')]
    for written in (calls[:1], calls):
        assert parse_reply(render_calls(written, fmt), fmt, TOOLS) == Reply(None, tuple(written))


def test_results_and_tools_as_text():
    assert render_result("84", "hermes") == "<tool_response>\n84\n</tool_response>"
    assert render_result("84", "json") == "Tool result: 84"
    tool = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    for fmt in ("hermes", "json"):
        announced = render_tools([tool], fmt)
        assert json.dumps(tool) in announced and "arguments" in announced


def test_the_format_is_detected_from_the_chat_template():
    qwen_like = "{%- if tools %}...<tool_call>\\n{{ tool_call | tojson }}\\n</tool_call>{%- endif %}"
    assert detect_format(qwen_like) == "hermes"
    assert detect_format("{% for m in messages %}{{ m['content'] }}{% endfor %}") == "json"
    assert detect_format(None) == "json"

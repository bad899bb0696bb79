"""Tool calls in a model's own words: how a model family writes a call in its completion, how the calls
and the tools' results of earlier turns are written back into its prompt, and how the tools are
announced to a model whose chat template has no place for them.

Two formats, chosen by name or detected from the chat template (``detect_format``):

- ``hermes`` (Hermes, Qwen 2.5 / 3 and the models tuned on their data): each call is a JSON object
  ``{"name": ..., "arguments": {...}}`` inside ``<tool_call>...</tool_call>``; results come back
  inside ``<tool_response>...</tool_response>``.
- ``json``: the whole completion is one such JSON object (``"parameters"`` is taken for
  ``"arguments"``, as Llama 3.1 writes it) or a list of them.

A completion that does not parse as calls of the offered tools (broken JSON, an unclosed tag, a tool
that was not offered, arguments that are not an object) is plain content: the agent sees the text and
``finish_reason`` ``stop``, as an OpenAI-compatible server answers it, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reply:
    """A completion read as an assistant message."""

    content: str | None
    """The text outside the calls; None when there is none."""
    calls: tuple[tuple[str, str], ...]
    """Each call's tool name and JSON arguments, in the order written."""


def detect_format(chat_template: str | None) -> str:
    """The format a chat template speaks: ``hermes`` where it writes ``<tool_call>``, else ``json``."""
    return "hermes" if chat_template and "<tool_call>" in chat_template else "json"


def parse_reply(text: str, fmt: str, tool_names: set[str]) -> Reply:
    """The completion ``text`` as content and calls of the tools ``tool_names`` in the format ``fmt``;
    plain content (no calls) for anything else."""
    if not tool_names:
        return Reply(text.strip() or None, ())
    found = _hermes_calls(text) if fmt == "hermes" else _json_calls(text)
    if found is None:
        return Reply(text.strip() or None, ())
    content, objects = found
    calls = []
    for obj in objects:
        call = _call(obj, tool_names)
        if call is None:
            return Reply(text.strip() or None, ())
        calls.append(call)
    return Reply(content, tuple(calls))


def _hermes_calls(text: str) -> tuple[str | None, list[Any]] | None:
    if "<tool_call>" not in text:
        return None
    objects, outside, end = [], [], 0
    for match in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
        outside.append(text[end:match.start()])
        end = match.end()
        try:
            objects.append(json.loads(match.group(1)))
        except json.JSONDecodeError:
            return None
    outside.append(text[end:])
    rest = "".join(outside)
    if "<tool_call>" in rest or "</tool_call>" in rest:  # a call left open (truncated) or a stray tag
        return None
    return rest.strip() or None, objects


def _json_calls(text: str) -> tuple[str | None, list[Any]] | None:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    try:
        value = json.loads(fenced.group(1) if fenced else body)
    except json.JSONDecodeError:
        return None
    objects = value if isinstance(value, list) else [value]
    return (None, objects) if objects else None


def _call(obj: Any, tool_names: set[str]) -> tuple[str, str] | None:
    """``(name, JSON arguments)`` of one written call, or None if it is not a call of an offered tool."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in tool_names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def render_calls(calls: list[tuple[str, str]], fmt: str) -> str:
    """Calls (tool name, JSON arguments) as the model writes them, for a chat template that does not
    render an assistant message's ``tool_calls`` itself."""
    objects = [{"name": name, "arguments": json.loads(arguments)} for name, arguments in calls]
    if fmt == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(obj, ensure_ascii=False)}\n</tool_call>" for obj in objects)
    return json.dumps(objects[0] if len(objects) == 1 else objects, ensure_ascii=False)


def render_result(content: str, fmt: str) -> str:
    """A tool's result as a user turn carries it, for a chat template without a ``tool`` role."""
    return f"<tool_response>\n{content}\n</tool_response>" if fmt == "hermes" else f"Tool result: {content}"


def render_tools(tools: list[dict], fmt: str) -> str:
    """The system prompt's announcement of ``tools`` (OpenAI ``{"type": "function", "function": {...}}``
    entries), for a chat template that takes no ``tools``."""
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    if fmt == "hermes":
        return ("# Tools\n\nYou may call one or more functions to help with the user's request. The function "
                f"signatures are within <tools></tools> XML tags:\n<tools>\n{signatures}\n</tools>\n\nFor each "
                "function call, write a JSON object with the function's name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")
    return ("You can call these functions:\n"
            f"{signatures}\n\nTo call one, reply with only a JSON object {{\"name\": <function-name>, "
            "\"arguments\": <args-json-object>}; to call several, a JSON list of such objects.")

"""Chat templates: the prompt format of a tokenizer, its own chat template or ``PLAIN_CHAT_TEMPLATE``
for a tokenizer without one."""

from __future__ import annotations

PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'User: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ 'Assistant: ' + message['content'] + eos_token + '\\n' }}"
    "{%- else -%}{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)
"""Prompt format of a tokenizer without a chat template: the system message and a blank line, then
``User: <text>`` and ``Assistant: <text><eos>`` lines; the generation prompt is ``Assistant:``."""


def use_chat_template(tokenizer, template: str | None = None):
    """``tokenizer`` with ``template`` as its chat template if given, else with its own, else with
    ``PLAIN_CHAT_TEMPLATE``; returns it (changed in place)."""
    if template is not None:
        tokenizer.chat_template = template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer

"""A conversation on token ids: how a token sequence goes on after an assistant turn the policy sampled.

The sampled tokens stay as they are; what follows them is the chat template's own text after that turn
(the rest of the assistant message's closing, the new messages, the next generation prompt), tokenised
on its own and appended. Rendering the whole conversation again and tokenising it would not do: a
template may render the earlier turns differently, and tokenising text is not the inverse of decoding
the tokens the policy chose. The template's parts are read off renders of a conversation whose messages
are sentinels. Multi-turn episodes (``multi_turn``) and agents' clients (``chat_client``) both go on
this way.
"""

from __future__ import annotations

SENTINEL_USER, SENTINEL_ASSISTANT = "LitPpoUserSentinel", "LitPpoAssistantSentinel"
"""Message contents that locate a template's markup around a message in a render of it."""


def assistant_close(rendered: str) -> str | None:
    """What the template writes after an assistant message's content, read off ``rendered``: a render
    that ends with the assistant message ``SENTINEL_ASSISTANT``. None unless that content appears in it
    exactly once (verbatim)."""
    if rendered.count(SENTINEL_ASSISTANT) != 1:
        return None
    return rendered.split(SENTINEL_ASSISTANT, 1)[1]


def appended(before: str, after: str) -> str | None:
    """The text that the render ``after`` adds to the render ``before`` of the conversation it continues;
    None where the template renders that conversation differently once more messages follow."""
    return after[len(before):] if after.startswith(before) else None


def close_after(tokenizer, close: str, completion_ids: list[int]) -> str:
    """The template's closing of an assistant message (``close``) less the stop token that the policy
    already generated at the end of ``completion_ids``: what an episode appends before its next message."""
    generated_end = tokenizer.decode(completion_ids[-1:], skip_special_tokens=False) if completion_ids else ""
    return close[len(generated_end):] if generated_end and close.startswith(generated_end) else close


def continuation_ids(tokenizer, close: str, completion_ids: list[int], text: str) -> list[int]:
    """The token ids that continue a conversation after the sampled assistant turn ``completion_ids`` with
    ``text``, the template's render of what follows the turn's closing ``close``: the rest of the closing
    (``close_after``), then ``text``, tokenised together; the tokens before are never re-tokenised."""
    return list(tokenizer.encode(close_after(tokenizer, close, completion_ids) + text, add_special_tokens=False))

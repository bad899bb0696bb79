"""The shipped agent (lit_ppo.tasks.retry_agent): its reward for a right first answer, a right second one, none
and a cut-off reply, and the conversation it holds, on a scripted OpenAI-shaped client."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.retry_agent import WRONG, answer_with_retries


class Scripted:
    """``chat.completions.create`` replying with the next of ``replies`` ((content, finish_reason) pairs)."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, messages):
        self.requests.append([dict(m) if isinstance(m, dict) else m for m in messages])
        content, reason = self.replies.pop(0)
        message = SimpleNamespace(role="assistant", content=content)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=reason)])


@pytest.mark.parametrize("replies, reward, calls", [
    ([(" 7", "stop")], 1.0, 1),
    ([("3", "stop"), ("7", "stop")], 0.5, 2),
    ([("3", "stop"), ("4", "stop")], 0.0, 2),
    ([("333", "length")], 0.0, 1),
])
def test_the_reward_halves_with_every_try_it_took(replies, reward, calls):
    client = Scripted(*replies)
    assert answer_with_retries(client, Problem("3+4=", "7")) == reward
    assert len(client.requests) == calls
    if calls == 2:  # the retry continues the conversation: the wrong answer, then the user's reply
        second = client.requests[1]
        assert second[0] == {"role": "user", "content": "3+4="} and second[1].content == "3"
        assert second[2] == {"role": "user", "content": WRONG}

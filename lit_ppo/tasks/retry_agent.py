"""The agent of ``data=agent`` as shipped: it answers a problem through the OpenAI-compatible client and, when
the answer is wrong, says so in the same conversation and lets the policy try again.

It is an ordinary agent (``lit_ppo.tasks.agent``), written as a user would write theirs: replace it with
``data.task_kwargs.agent=my_agent.solve``. Its messages are spelled in the tiny model's characters, so it
trains the tiny model on the arithmetic problems within minutes on a CPU.
"""

from __future__ import annotations

TRIES = 2
"""Answers the policy may give per episode."""
WRONG = "wrong, try again"
"""The user's reply to a wrong answer."""


def answer_with_retries(client, problem) -> float:
    """1.0 for the right answer on the first try, 0.5 on the second, 0.0 for none: the reward halves with
    every try it took."""
    messages = [{"role": "user", "content": problem.prompt}]
    for attempt in range(TRIES):
        reply = client.chat.completions.create(messages=messages)
        message = reply.choices[0].message
        if (message.content or "").strip() == problem.answer:
            return 0.5 ** attempt
        if reply.choices[0].finish_reason == "length":  # cut off: nothing to answer
            return 0.0
        messages += [message, {"role": "user", "content": WRONG}]
    return 0.0

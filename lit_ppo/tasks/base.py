"""The task protocol: a source of problems and a verifiable reward for a completion; and the contracts of
the tasks played as conversations: a multi-turn task's environment, an agent task's agent and the client
it is handed."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable


class Columns(Mapping[str, Any]):
    """A read-only, picklable mapping of a record's fields (column name -> value)."""

    def __init__(self, items: Mapping[str, Any] | None = None):
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Columns({self._items!r})"


@dataclass(frozen=True)
class Problem:
    """One prompt of a task."""

    prompt: str
    """The user message (the chat template is applied by the rollout workflow); for a prompt given
    as chat messages, the content of its last user message (for logs)."""
    answer: str
    """The gold answer the reward checks against."""
    messages: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False)
    """The whole prompt as chat messages ({'role', 'content'}), which the workflow templates instead
    of ``prompt``; None: the prompt is the single user message ``prompt``."""
    columns: Mapping[str, Any] = field(default_factory=Columns, hash=False)
    """Every other field of the problem's record (read-only), passed to reward functions by name."""


@runtime_checkable
class Task(Protocol):
    name: str
    """Short name, used in logs and run names."""

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in a fixed order (deterministic for a given task config)."""

    def reward(self, problem: Problem, completion: str) -> float:
        """Reward of a completion's text, in [0, 1]; anything but a finite real number is an invalid
        reward (see data.on_invalid_reward). A task may also define ``group_rewards(problem,
        completions) -> list`` (the rewards of one prompt's completions at once), which the
        single-turn workflow then calls instead. Either may be ``async def``: a prompt's rewards are then
        awaited together, as asynchronous reward functions are (``lit_ppo.tasks.rewards.calls``)."""

    def allowed_completion_tokens(self, tokenizer) -> list[int] | None:
        """Token ids completions may use (the tokenizer's EOS included), or None for all."""


def task_name(task: Task) -> str:
    """The task's ``name``, or its class name for a task without one."""
    return str(getattr(task, "name", type(task).__name__))


# ---------------------------------------------------------------------------------------------
# tasks played as conversations
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Environment(Protocol):
    """The other side of one multi-turn episode (a tool, a user, a grader), created per episode by
    ``MultiTurnTask.environment(problem)``; it may keep state across the episode's turns."""

    def start(self) -> str:
        """The first user message of the episode."""

    def step(self, completion: str) -> tuple[str | None, float | None]:
        """React to one assistant turn (its text, special tokens removed): ``(feedback, reward)``.

        ``feedback`` is the next user message (tool output, user feedback), or None to end the
        episode. ``reward`` is the episode's reward should it end after this turn (the workflow may
        also end it at ``max_turns`` or on a truncated turn); None keeps the last reported one (0.0
        if none was). Any other value must be a finite real number (``reward_problem``).
        """


@runtime_checkable
class MultiTurnTask(Task, Protocol):
    """A task whose episodes are conversations with an environment (``lit_ppo.rollout.episodes.multi_turn``
    plays them)."""

    def environment(self, problem: Problem) -> Environment:
        """A fresh environment for one episode of ``problem``."""


def is_multi_turn(task: Task) -> bool:
    """Whether ``task`` is a ``MultiTurnTask`` (it has a callable ``environment``)."""
    return callable(getattr(task, "environment", None))


class ChatCompletions(Protocol):
    """``client.chat.completions``."""

    def create(self, **request: Any) -> Any:
        """One chat completion (the ``openai`` SDK's ``ChatCompletion``; an awaitable of one for an async
        agent's client)."""


class Chat(Protocol):
    """``client.chat``."""

    completions: ChatCompletions


class ChatClient(Protocol):
    """The OpenAI-compatible client an agent plays its episode through, in the shape of ``openai.OpenAI``
    (``openai.AsyncOpenAI`` for an async agent). The rollout's client
    (``lit_ppo.rollout.episodes.chat_client``) has this shape; a task is typed against the shape alone."""

    chat: Chat
    """``chat.completions.create(messages=..., tools=...)``."""
    base_url: str | None
    """Where the same episode is served over HTTP (``openai.OpenAI(base_url=..., api_key=...)``); None if
    nowhere."""
    api_key: str | None
    """The episode's key at ``base_url``."""


@runtime_checkable
class AgentTask(Task, Protocol):
    """A task whose episodes an agent plays (``lit_ppo.rollout.episodes.agent`` plays them)."""

    def agent(self, client: ChatClient, problem: Problem) -> Any:
        """Play one episode of ``problem`` through ``client`` (``client.chat.completions.create``); the
        episode's reward, or an awaitable of it."""


def is_agent(task: Task) -> bool:
    """Whether ``task`` is an ``AgentTask`` (it has a callable ``agent``)."""
    return callable(getattr(task, "agent", None))


def vocabulary_ids(tokenizer, tokens: Sequence[str], needed_by: str) -> list[int]:
    """Ids of ``tokens``, each one entry of ``tokenizer``'s vocabulary, then its EOS: a restricted
    completion alphabet. Entries are looked up, not encoded: encoders may add a prefix space or split
    differently, while the entry is what sampling must allow. ValueError naming ``needed_by`` for a
    token the vocabulary lacks, or a tokenizer without EOS."""
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = []
    for token in dict.fromkeys(tokens):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (unk is not None and token_id == unk):
            raise ValueError(f"the tokenizer has no single token for {token!r}, which {needed_by} needs")
        ids.append(token_id)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer has no EOS token (eos_token_id is None); {needed_by} needs one to end "
                         f"a completion")
    return ids + [tokenizer.eos_token_id]


SPLITS = ("train", "test")


def split_problems(splits: dict[str, Sequence[Problem]], split: str) -> Sequence[Problem]:
    """``splits[split]``, with the error every task gives for an unknown split."""
    if split not in splits:
        raise ValueError(f"split={split!r} is invalid: must be one of {', '.join(map(repr, SPLITS))}")
    return splits[split]


# ---------------------------------------------------------------------------------------------
# what a reward is
# ---------------------------------------------------------------------------------------------

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: the batch stores rewards as float32, where anything larger becomes inf."""


def _scalar(value: Any) -> Any:
    """A 0-d torch tensor, numpy scalar or 0-d array as the Python number it holds; anything else as is."""
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def reward_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable reward, or None if it is one.

    A reward is a real number: int, float, bool (True is 1.0, as in Python arithmetic), or a 0-d
    torch tensor, numpy scalar or 0-d array holding one; it must be finite and within float32 range,
    since the batch stores rewards as float32 and a larger finite value would become inf there.
    None, strings (even '1.0'), complex numbers and tensors with a dimension (even of size 1) are not
    rewards.
    """
    value = _scalar(value)
    if not isinstance(value, numbers.Real):
        return "not a real number"
    try:
        number = float(value)
    except OverflowError:  # an int or Fraction beyond any float
        return "outside the float32 range"
    if not math.isfinite(number):
        return "not finite"
    if abs(number) > FLOAT32_MAX:
        return "outside the float32 range"
    return None


def reward_float(value: Any) -> float:
    """A reward (``reward_problem(value) is None``) as a Python float."""
    return float(_scalar(value))

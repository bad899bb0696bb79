"""How reward functions are called (TRL's keywords) and how a batch's calls are scored and summed.

A reward function is called with keywords only, as TRL's GRPOTrainer calls it:
``fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]``.
``prompts`` and ``completions`` are lists (strings, or for a prompt given as chat messages the
messages, the completion then being ``[{'role': 'assistant', 'content': text}]``), ``completion_ids``
the completions' token ids (lists of ints, the stop token included), ``trainer_state`` an object whose
``global_step`` is the iteration that sampled the completions (the policy version), and every other
column of the dataset arrives as a keyword holding a list of the same length. So reward functions
written for TRL run unchanged (they should accept ``**kwargs``), and so do functions written as
``fn(prompts, completions, answer, **kwargs)``. A function may be ``async def`` (or return an
awaitable): the awaitables of a batch's groups are awaited together, on an event loop of their own, a
limited number at once and each within a timeout (``score_calls``). A value
of None means "not applicable to this sample". The sample's reward is ``sum_i w_i * r_i`` over the
functions that returned a number (TRL's weighted nansum); if every function returned None, the reward
is None, which the workflow treats as an invalid reward (``data.on_invalid_reward``: stop the run, or
drop the group).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import re
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from lit_ppo.errors import RunStopped
from lit_ppo.tasks.base import reward_float, reward_problem
from lit_ppo.utils.stop_requests import received_signal
from lit_ppo.utils.text import shorten

CALL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state")
"""The keywords every reward function is called with, besides one per dataset column."""


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a usable reward (``reward_problem``), else None."""
    return None if reward_problem(value) is not None else reward_float(value)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is, a list of messages as its last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


@dataclass(frozen=True)
class TrainerState:
    """What a reward function gets as ``trainer_state``: the part of TRL's ``TrainerState`` lit_ppo has."""

    global_step: int
    """The iteration that sampled the completions: the policy version, the number of updates before it."""


@dataclass(frozen=True)
class RewardFunction:
    """One configured reward function."""

    name: str
    """As configured: a built-in name, a dotted path or a reward model directory."""
    fn: Callable
    """The function, called with TRL's keywords."""
    weight: float
    """Its weight in the sum."""
    takes_answer: bool
    """It gets the gold answer as ``answer`` (the built-ins, a judge)."""
    needs_answer: bool
    """It compares with the gold answer: the ``answer_key`` column must be there."""
    metric: str
    """Its name in metrics (``rollout/rewards/<metric>/mean``): a built-in's name, else the function's
    ``__name__``, characters other than letters, digits and ``_.-`` replaced by ``_``."""


@dataclass(frozen=True)
class GroupScores:
    """One prompt group's rewards: the weighted sums and each function's own values."""

    rewards: list[Any]
    """The weighted sum per completion; None where every function returned None; a value that is not a
    usable reward is passed on as is, for the workflow's check."""
    terms: dict[str, list[float]]
    """Per function (by ``RewardFunction.metric``, in configured order): its value per completion, NaN
    where it returned None or something that is not a usable reward."""


def _callable_name(fn: Callable) -> str:
    """The name of ``fn``: its ``__name__``, a partial's function's, or a callable object's class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def metric_names(names: Sequence[str]) -> list[str]:
    """``names`` with only letters, digits and ``_.-`` (others become ``_``), a repeated one numbered
    ``-2``, ``-3``, ... in order."""
    out: list[str] = []
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "reward"
        unique, n = base, 1
        while unique in out:
            n += 1
            unique = f"{base}-{n}"
        out.append(unique)
    return out


def check_call_signatures(fns: Sequence[RewardFunction], columns: Sequence[str],
                          prefix: str = "data.task_kwargs.") -> None:
    """ValueError in one line for a function that cannot be called with TRL's keywords and ``columns``
    (the dataset's columns passed by name), saying how to write it."""
    for i, f in enumerate(fns):
        try:
            signature = inspect.signature(f.fn)
        except (TypeError, ValueError):  # a callable without a readable signature is taken on trust
            continue
        keywords = dict.fromkeys([*CALL_KEYWORDS, *columns, *(["answer"] if f.takes_answer else [])])
        try:
            signature.bind(**keywords)
        except TypeError as e:
            name = _callable_name(f.fn)
            raise ValueError(
                f"{prefix}reward_fns[{i}]={f.name!r}: {name}{signature} cannot take the keywords reward functions "
                f"are called with ({', '.join(keywords)}): {e}; name its parameters after them and end with "
                f"**kwargs, e.g. def {name}(completions, **kwargs)") from None


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """An event loop running on a daemon thread of its own, started on first use: asynchronous reward
    functions run there whatever the calling thread runs (a notebook's loop, the rollout producer)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, daemon=True, name="reward-event-loop").start()
        return _loop


def _raised(f: RewardFunction, error: BaseException, prompts: list, completions: list) -> RunStopped:
    """The one-line failure of reward function ``f`` that raised ``error``."""
    n = len(completions)
    reason = f"{type(error).__name__}: {str(error).splitlines()[0]}" if str(error) else type(error).__name__
    which = "completion" if n == 1 else f"first of {n} completions"
    return RunStopped(f"reward function {f.name!r} raised {reason} for prompt {shorten(repr(prompts[0]), 60)} "
                      f"({which} {shorten(repr(completions[0]), 40)})")


def _interrupt_is_its_own() -> bool:
    """Whether a KeyboardInterrupt that left a reward function was raised by the function itself: no stop
    signal was received, and SIGINT is not Python's default handler (which raises one for Ctrl-C)."""
    return received_signal() is None and signal.getsignal(signal.SIGINT) is not signal.default_int_handler


def _values(f: RewardFunction, values: Any, n: int) -> list:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != n:
        got = f"{len(values)} values" if hasattr(values, "__len__") and not isinstance(values, (str, bytes)) \
            else shorten(repr(values), 40)
        raise RunStopped(f"reward function {f.name!r} returned {got} for {n} completions: it must return a "
                         f"list with one float (or None) per completion")
    return list(values)


@dataclass(frozen=True)
class RewardCall:
    """What the reward functions are called with for one prompt group (TRL's keywords)."""

    prompts: list
    """The group's prompt, once per completion."""
    completions: list
    """The completions (strings, or ``[{'role': 'assistant', 'content': text}]`` for a chat prompt)."""
    completion_ids: list[list[int]]
    """Their token ids, the stop token included."""
    columns: dict[str, list]
    """Every other column of the problem's record, once per completion."""
    answers: list[str]
    """The gold answer, once per completion (the built-ins' ``answer``)."""


DEFAULT_REWARD_CONCURRENCY = 32
"""Awaitables of asynchronous reward functions awaited at once, by default."""


def score_calls(fns: Sequence[RewardFunction], calls: Sequence[RewardCall], step: int, *,
                concurrency: int = DEFAULT_REWARD_CONCURRENCY, timeout_s: float | None = None) -> list[GroupScores]:
    """Every function's values for each group of ``calls`` and their weighted sums.

    Each function is called once per group, as TRL calls it (``trainer_state.global_step`` = ``step``); a
    synchronous one computes there and then, in order. The awaitables that asynchronous ones return, of
    every group, are awaited together on the reward event loop, at most ``concurrency`` at once and each
    within ``timeout_s`` seconds (None: no limit), so a slow reward does not serialise the batch.

    RunStopped in one line naming the function (and the first sample of its group) if it raises, runs past
    ``timeout_s``, or returns something other than a list with one value per sample."""
    state = TrainerState(global_step=step)
    outputs: list[list[Any]] = []
    try:
        for call in calls:
            outputs.append([])
            for f in fns:
                outputs[-1].append(_called(f, call, state))
    except BaseException:
        _close_awaitables(outputs)
        raise
    pending = [(g, i) for g, outs in enumerate(outputs) for i, out in enumerate(outs) if inspect.isawaitable(out)]
    if pending:
        awaitables = [outputs[g][i] for g, i in pending]
        done = asyncio.run_coroutine_threadsafe(_bounded(awaitables, concurrency, timeout_s), _event_loop()).result()
        for (g, i), out in zip(pending, done):
            call = calls[g]
            if isinstance(out, _TimedOut):
                raise RunStopped(f"reward function {fns[i].name!r} took more than {timeout_s:g} s for prompt "
                                 f"{shorten(repr(call.prompts[0]), 60)}: make it faster or raise "
                                 f"data.task_kwargs.reward_timeout_s")
            if isinstance(out, BaseException):
                raise _raised(fns[i], out, call.prompts, call.completions) from out
            outputs[g][i] = out
    return [_combined(fns, outs, len(call.completions)) for call, outs in zip(calls, outputs)]


def awaited(values: Sequence[Any]) -> list:
    """``values`` with each awaitable among them (what an ``async def`` task reward returns) replaced by its
    result, awaited together on the reward event loop, at most ``DEFAULT_REWARD_CONCURRENCY`` at once; the first
    exception one raised is raised here."""
    pending = [i for i, value in enumerate(values) if inspect.isawaitable(value)]
    out = list(values)
    if pending:
        bounded = _bounded([values[i] for i in pending], DEFAULT_REWARD_CONCURRENCY, None)
        for i, result in zip(pending, asyncio.run_coroutine_threadsafe(bounded, _event_loop()).result()):
            if isinstance(result, BaseException):
                raise result
            out[i] = result
    return out


def _called(f: RewardFunction, call: RewardCall, state: TrainerState) -> Any:
    """``f``'s return value for one group (an awaitable, for an asynchronous function)."""
    kwargs = dict(call.columns)
    if f.takes_answer:
        kwargs["answer"] = call.answers
    try:
        return f.fn(prompts=call.prompts, completions=call.completions, completion_ids=call.completion_ids,
                    trainer_state=state, **kwargs)
    except KeyboardInterrupt as e:
        if not _interrupt_is_its_own():
            raise
        raise _raised(f, e, call.prompts, call.completions) from e
    except Exception as e:
        raise _raised(f, e, call.prompts, call.completions) from e


def _close_awaitables(outputs: list[list[Any]]) -> None:
    """Close the coroutines that will not be awaited (a later call raised), so none is left unawaited."""
    for outs in outputs:
        for out in outs:
            if inspect.iscoroutine(out):
                out.close()


class _TimedOut:
    """What an awaitable that ran past the timeout gives (a function's own TimeoutError is its error)."""


async def _bounded(awaitables: list, limit: int, timeout_s: float | None) -> list:
    """Each awaitable's result (or the exception it raised, ``_TimedOut`` past ``timeout_s``), at most ``limit``
    awaited at once."""
    slots = asyncio.Semaphore(limit)

    async def one(awaitable):
        async with slots:
            deadline = asyncio.timeout(timeout_s)
            try:
                async with deadline:
                    return await awaitable
            except TimeoutError:
                if deadline.expired():
                    return _TimedOut()
                raise

    return await asyncio.gather(*(one(a) for a in awaitables), return_exceptions=True)


def _combined(fns: Sequence[RewardFunction], outputs: list[Any], n: int) -> GroupScores:
    """The weighted sums and each function's values of one group's outputs."""
    totals: list[Any] = [None] * n
    terms: dict[str, list[float]] = {}
    for f, out in zip(fns, outputs):
        values = _values(f, out, n)
        terms[f.metric] = [math.nan if value is None or _number(value) is None else _number(value)
                           for value in values]
        for i, value in enumerate(values):
            if value is None or (totals[i] is not None and _number(totals[i]) is None):
                continue  # not applicable, or this sample already holds an invalid value
            number = _number(value)
            totals[i] = value if number is None else (totals[i] or 0.0) + f.weight * number
    return GroupScores(totals, terms)

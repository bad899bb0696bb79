"""The preference pairs of ``python -m lit_ppo rm``, in TRL's forms, as token ids of each side, read without
Lightning (the checks before a run read them so).

A pair is a prompt and two completions of it, ``chosen`` and ``rejected``, and an optional ``margin`` (a number,
TRL's column: the lead by which the chosen side must win; 0 where absent). Its rows come from:

- a file (``data=dataset``, ``data.task_kwargs.train_path``, and ``test_path`` or ``test_fraction``): with a prompt
  column (``data.task_kwargs.prompt_key``: a string or chat messages; each side a string or one assistant
  message), or without one, where the prompt is what both sides share (TRL's implicit prompt): two
  conversations that differ only in their last, assistant message, or two strings, whose prompt is their
  common beginning (a space where they part goes with the completions);
- a task's problems (``data=<task>``), each made into pairs by ``rm.pairs_fn``, the prompt being the problem's
  as a reward function receives it in ``fit`` (its chat messages, or its prompt string).

Each side is what the reward model reads when ``reward_fns`` scores that completion in ``fit``
(``lit_ppo.tasks.rewards.model.reward_model_text``: the conversation through the model's chat template), so that
it learns on the texts it will score. A row without a side, with an empty side or two identical sides, whose
conversations' prompts differ, or with a side longer than ``rm.max_length`` tokens, is refused in one line naming
where its user finds it (``pairs.jsonl line 14``, ``data.task=arithmetic problems('train')[3]``): nothing is
dropped or cut silently."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from lit_ppo.config.rm import RMConfig
from lit_ppo.tasks import build_task
from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.dataset import PREFIX, held_out_split, read_rows, row_places
from lit_ppo.tasks.rewards.model import reward_model_text
from lit_ppo.utils.imports import import_function

SIDES = ("chosen", "rejected")
"""The columns of a pair's two completions (TRL's)."""
MARGIN = "margin"
"""The optional column of a pair's margin (TRL's)."""


class PreferencePair(NamedTuple):
    """A prompt, its preferred and its other completion, and where its user finds it."""

    prompt: str | tuple[dict, ...]
    """A string (the user message) or chat messages, as ``fit`` gives a reward function its prompt."""
    chosen: str
    rejected: str
    margin: float
    where: str
    """Its row as the user sees it: ``pairs.jsonl line 14``, ``data.task=arithmetic problems('train')[3]``."""


@dataclass(frozen=True)
class PairExample:
    """One tokenised pair."""

    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    margin: float


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)


def _messages(value: Any) -> tuple[dict, ...] | None:
    """``value`` as chat messages, or None when it is not a non-empty list of ``{role, content}``."""
    if isinstance(value, (list, tuple)) and value and all(_is_message(m) for m in value):
        return tuple({"role": m["role"], "content": m["content"]} for m in value)
    return None


def _completion(value: Any, side: str, where: str) -> str:
    """A side given after an explicit prompt: a string, or one assistant message (alone or in a list)."""
    if isinstance(value, str):
        return value
    messages = _messages([value] if isinstance(value, dict) else value)
    if messages is not None and len(messages) == 1 and messages[0]["role"] == "assistant":
        return messages[0]["content"]
    raise ValueError(f"{where}, column {side!r}: {type(value).__name__} is not a completion: give a string or one "
                     f"assistant message {{role: assistant, content}}")


def _shared_prompt(chosen: Any, rejected: Any, where: str) -> tuple[str | tuple[dict, ...], str, str]:
    """``(prompt, chosen completion, rejected completion)`` of a row without a prompt column (TRL's implicit
    prompt): two conversations ending in one assistant message each after the same messages, or two strings
    and their common beginning."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        shared = os.path.commonprefix([chosen, rejected])
        if shared != chosen and shared != rejected and shared.endswith(" "):
            shared = shared[:-1]  # the completions start with the space before them, as sampled text does
        return shared, chosen[len(shared):], rejected[len(shared):]
    sides = [_messages(value) for value in (chosen, rejected)]
    for name, messages in zip(SIDES, sides):
        if messages is None or messages[-1]["role"] != "assistant" or len(messages) < 2:
            raise ValueError(f"{where}, column {name!r}: without a prompt column each side is a string, or a "
                             f"conversation ending in the assistant's completion after the prompt's messages")
    if sides[0][:-1] != sides[1][:-1]:
        raise ValueError(f"{where}: the prompt differs between the sides (the messages before the last differ): "
                         f"both sides of a pair answer one prompt")
    return sides[0][:-1], sides[0][-1]["content"], sides[1][-1]["content"]


def _margin(row: dict, where: str) -> float:
    value = row.get(MARGIN, 0.0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}, column {MARGIN!r}: {value!r} is not a finite number")
    return float(value)


def row_pair(row: dict, prompt_key: str, where: str) -> PreferencePair:
    """The pair of one row (the module docstring's forms); ValueError of one line naming ``where``."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: {type(row).__name__} is not a pair: give a mapping of chosen and rejected "
                         f"(and prompt, margin)")
    missing = [name for name in SIDES if row.get(name) is None]  # a file's rows hold every column, null where absent
    if missing:
        columns = ", ".join(str(name) for name, value in row.items() if value is not None) or "none"
        raise ValueError(f"{where} has no column {missing[0]!r}: a pair holds chosen and rejected, with a "
                         f"{prompt_key!r} column or the prompt at the start of both; its columns: {columns}")
    if row.get(prompt_key) is not None:
        value = row[prompt_key]
        prompt = value if isinstance(value, str) else _messages(value)
        if prompt is None:
            raise ValueError(f"{where}, column {prompt_key!r}: {type(value).__name__} is not a string or a list of "
                             f"chat messages {{role, content}}")
        chosen, rejected = (_completion(row[side], side, where) for side in SIDES)
    else:
        prompt, chosen, rejected = _shared_prompt(row["chosen"], row["rejected"], where)
    for side, text in zip(SIDES, (chosen, rejected)):
        if not text.strip():
            raise ValueError(f"{where}: its {side} completion is empty: each side of a pair needs a completion")
    if chosen == rejected:
        raise ValueError(f"{where}: its chosen and rejected completions are identical ({chosen[:40]!r}): a pair "
                         f"needs two different completions")
    return PreferencePair(prompt, chosen, rejected, _margin(row, where), where)


def problem_prompt(problem: Problem) -> str | tuple[dict, ...]:
    """The prompt of ``problem`` as a reward function receives it in ``fit``: its messages, else its prompt."""
    return tuple(dict(m) for m in problem.messages) if problem.messages is not None else problem.prompt


def problem_pairs(problem: Problem, pairs_fn, where: str) -> list[PreferencePair]:
    """The pairs that ``pairs_fn`` makes of ``problem`` (a mapping of chosen and rejected, or a list of them)."""
    made = pairs_fn(problem)
    rows = made if isinstance(made, (list, tuple)) else [made]
    if not rows:
        raise ValueError(f"rm.pairs_fn returned no pair for {where}: return a mapping of chosen and rejected, or "
                         f"a list of them")
    prompt = problem_prompt(problem)
    return [row_pair({**row, "prompt": prompt} if isinstance(row, dict) else row, "prompt",
                     f"rm.pairs_fn of {where}" + (f" pair {i}" if len(rows) > 1 else ""))
            for i, row in enumerate(rows)]


def preference_pairs(task: str, task_kwargs: dict[str, Any] | None, cfg: RMConfig) -> dict[str, list[PreferencePair]]:
    """``{'train': ..., 'test': ...}`` pairs of the ``data`` section: a dataset's rows (the test split its
    ``test_path``, or ``test_fraction`` of the rows held out), or the pairs ``rm.pairs_fn`` makes of a task's
    problems."""
    kwargs = dict(task_kwargs or {})
    if task != "dataset":
        if cfg.pairs_fn is None:
            raise ValueError(f"data.task={task} gives problems, not pairs: give rm.pairs_fn=module.function, which "
                             f"makes a problem's pair of chosen and rejected completions (or use data=dataset)")
        pairs_fn = import_function(cfg.pairs_fn, "rm.pairs_fn")
        built = build_task(task, **kwargs)
        return {split: [pair for i, p in enumerate(built.problems(split))
                        for pair in problem_pairs(p, pairs_fn, f"data.task={task} problems({split!r})[{i}]")]
                for split in ("train", "test")}
    if cfg.pairs_fn is not None:
        raise ValueError(f"rm.pairs_fn={cfg.pairs_fn} makes pairs of a task's problems: data=dataset reads its pairs "
                         f"from the rows (drop rm.pairs_fn)")
    if kwargs.get("train_path") is None:
        raise ValueError(f"{PREFIX}train_path is required: give {PREFIX}train_path=<file>")
    prompt_key = kwargs.get("prompt_key") or "prompt"

    def load(key: str) -> list[PreferencePair]:
        path = os.fspath(kwargs[key])
        rows = read_rows(path, key)
        return [row_pair(row, prompt_key, where) for row, where in zip(rows, row_places(path, len(rows)))]

    train = load("train_path")
    if kwargs.get("test_path") is not None:
        return {"train": train, "test": load("test_path")}
    splits = held_out_split(tuple(train), kwargs.get("test_fraction"), kwargs.get("seed", 0), kwargs["train_path"])
    return {"train": list(splits[0]), "test": list(splits[1])}


def tokenize_pair(tokenizer, pair: PreferencePair, max_length: int) -> PairExample:
    """Each side of ``pair`` as the reward model reads it (``reward_model_text``), tokenised as ``reward_fns``
    tokenises it (no special tokens added); ValueError naming the row for a side over ``max_length`` tokens."""
    sides = []
    for side, completion in zip(SIDES, (pair.chosen, pair.rejected)):
        prompt = pair.prompt if isinstance(pair.prompt, str) else [dict(m) for m in pair.prompt]
        ids = tokenizer(reward_model_text(tokenizer, prompt, completion), add_special_tokens=False)["input_ids"]
        if len(ids) > max_length:
            raise ValueError(f"{pair.where}: its {side} side is {len(ids)} tokens, more than rm.max_length="
                             f"{max_length}: raise rm.max_length, or shorten the pair")
        sides.append(tuple(ids))
    return PairExample(sides[0], sides[1], pair.margin)


class RMPairs:
    """The train and test pairs of the ``data`` section, checked when read (a bad row is one line naming it) and
    tokenised by ``tokenize``.

    Args:
        task: the registered task or dotted path (``data.task``): ``dataset`` for rows of pairs.
        task_kwargs: its settings (``data.task_kwargs``).
        rm: the ``rm`` section.
    """

    def __init__(self, task: str, task_kwargs: dict | None, rm: RMConfig):
        self.cfg = rm
        self.pairs = preference_pairs(task, task_kwargs, rm)
        if not self.pairs["train"]:
            raise ValueError(f"data.task={task!r} has no training pairs")
        self.examples: dict[str, list[PairExample]] = {}

    def tokenize(self, tokenizer) -> None:
        """Tokenise both splits with ``tokenizer`` (the model's, with its chat template) into ``examples``."""
        for split, pairs in self.pairs.items():
            self.examples[split] = [tokenize_pair(tokenizer, pair, self.cfg.max_length) for pair in pairs]

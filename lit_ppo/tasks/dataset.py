"""The user's own data: local files or a saved dataset directory, rewarded by TRL-style reward functions.

``data=dataset`` reads ``train_path`` (and ``test_path``) with the ``datasets`` library, offline:
a .jsonl / .json / .parquet / .csv file, or a directory written by ``Dataset.save_to_disk`` (a
``DatasetDict`` directory gives its 'train' split). Each row's ``prompt_key`` column is the prompt
(a string, or a list of chat messages {'role', 'content'}), its ``answer_key`` column the gold
answer, and every other column goes to the reward functions by name (see lit_ppo.tasks.rewards).
Each reward function is called once per prompt group, with lists of ``gconfig.n_samples`` entries.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from lit_ppo.tasks.base import Columns, Problem, split_problems
from lit_ppo.tasks.rewards import DEFAULT_FORMAT_PATTERN, RewardFunction, combined_rewards, resolve_reward_fns

PREFIX = "data.task_kwargs."
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File extension -> the ``datasets`` builder that reads it."""


def read_rows(path: str, key: str) -> list[dict[str, Any]]:
    """The rows of the file or saved dataset directory ``path`` as dicts, read offline; ValueError
    naming ``key`` and the file if it is missing, of another kind or unreadable."""
    where = f"{PREFIX}{key}={path!r}"
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{where}: no such file or directory")
    # datasets' own switch (read when it is imported), not HF_HUB_OFFLINE: a model may still come from the Hub.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets  # imported only when the task is used

    datasets.disable_progress_bars()
    if p.is_dir():
        try:
            loaded = datasets.load_from_disk(str(p))
        except Exception as e:
            raise ValueError(f"{where}: not a saved dataset directory ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"{where}: the saved DatasetDict has no 'train' split; splits: {', '.join(loaded)}")
            loaded = loaded["train"]
        return loaded.to_list()
    builder = FILE_FORMATS.get(p.suffix.lower())
    if builder is None:
        raise ValueError(f"{where}: unsupported extension {p.suffix!r}: must be one of "
                         f"{', '.join(FILE_FORMATS)} or a saved dataset directory")
    with tempfile.TemporaryDirectory(prefix="lit_ppo_dataset_") as cache:  # no cache left behind
        try:
            loaded = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache,
                                           keep_in_memory=True)
        except Exception as e:
            cause = e.__cause__ or e
            message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
            raise ValueError(f"{where}: cannot be read as {p.suffix.lstrip('.')} ({message})") from None
        return loaded.to_list()


def _messages(value: Any) -> tuple[dict[str, str], ...] | None:
    """``value`` as chat messages if it is a non-empty list of {'role': str, 'content': str}, else None."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return None
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def rows_to_problems(rows: list[dict[str, Any]], path: str, prompt_key: str,
                     answer_key: str | None) -> tuple[Problem, ...]:
    """Problems of the rows read from ``path``; ValueError naming the key, the file and the column for a
    missing column or a value of the wrong kind."""
    if not rows:
        raise ValueError(f"{path}: has no rows")
    names = list(rows[0])
    for key, column in (("prompt_key", prompt_key), ("answer_key", answer_key)):
        if column is not None and column not in names:
            raise ValueError(f"{PREFIX}{key}={column!r}: {path} has no column {column!r}; columns: {', '.join(names)}")
    problems = []
    for i, row in enumerate(rows):
        value = row[prompt_key]
        messages = None if isinstance(value, str) else _messages(value)
        if not isinstance(value, str) and messages is None:
            raise ValueError(f"{PREFIX}prompt_key={prompt_key!r}: {path} row {i}, column {prompt_key!r}: "
                             f"{type(value).__name__} is not a string or a list of chat messages {{role, content}}")
        if messages is not None and not any(m["role"] == "user" for m in messages):
            raise ValueError(f"{PREFIX}prompt_key={prompt_key!r}: {path} row {i}, column {prompt_key!r}: "
                             f"the chat messages have no 'user' message")
        prompt = value if messages is None else [m["content"] for m in messages if m["role"] == "user"][-1]
        answer = ""
        if answer_key is not None:
            gold = row[answer_key]
            if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
                raise ValueError(f"{PREFIX}answer_key={answer_key!r}: {path} row {i}, column {answer_key!r}: "
                                 f"{type(gold).__name__} is not a string or a number")
            # A column of ints and floats is read as floats: 2 stays "2", not "2.0".
            answer = str(int(gold)) if isinstance(gold, float) and gold.is_integer() else str(gold)
        columns = Columns({k: v for k, v in row.items() if k != prompt_key})
        problems.append(Problem(prompt=prompt, answer=answer, messages=messages, columns=columns))
    return tuple(problems)


@dataclass
class DatasetTask:
    """Prompts from the user's local data, rewarded by the weighted sum of TRL-style reward functions."""

    name: ClassVar[str] = "dataset"

    train_path: str
    """A .jsonl, .json, .parquet or .csv file, or a saved dataset directory, read offline."""
    test_path: str | None = None
    """The same for the 'test' split; None: ``test_fraction`` of the train rows, or no test split."""
    test_fraction: float | None = None
    """With no ``test_path``: this fraction of the rows (at least one), chosen with ``seed``, is the
    'test' split and the rest is 'train'; None: the 'test' split is empty."""
    seed: int = 0
    """Seed of the ``test_fraction`` split."""
    prompt_key: str = "prompt"
    """The column holding the prompt: a string (the user message), or a list of chat messages
    {'role', 'content'} that is templated as given."""
    answer_key: str | None = "answer"
    """The column holding the gold answer, given to the built-in rewards as ``answer`` (and, like every
    column, to every reward function by its name); None: no answer column."""
    reward_fns: list[str] = field(default_factory=lambda: ["math_verify"])
    """Reward functions: built-in names (exact_match, math_verify, format) or dotted paths
    module.function importable from the working directory, TRL's signature
    ``fn(prompts, completions, **columns) -> list[float | None]``."""
    reward_weights: list[float] | None = None
    """One weight per reward function; None: all 1.0. A sample's reward is the weighted sum over the
    functions that returned a number; None from every function is an invalid reward."""
    format_pattern: str = DEFAULT_FORMAT_PATTERN
    """The regular expression of the built-in ``format`` reward (searched anywhere in the completion)."""

    _fns: tuple[RewardFunction, ...] = field(init=False, repr=False, compare=False)
    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Everything is checked and loaded here, so that bad settings fail before any model loads.
        if not isinstance(self.prompt_key, str) or not self.prompt_key:
            raise ValueError(f"{PREFIX}prompt_key={self.prompt_key!r} is invalid: must be a column name")
        if self.answer_key is not None and (not isinstance(self.answer_key, str) or not self.answer_key):
            raise ValueError(f"{PREFIX}answer_key={self.answer_key!r} is invalid: must be a column name or null")
        if self.test_fraction is not None:
            if self.test_path is not None:
                raise ValueError(f"{PREFIX}test_fraction={self.test_fraction!r} is invalid with {PREFIX}test_path: "
                                 f"give one of them")
            if isinstance(self.test_fraction, bool) or not isinstance(self.test_fraction, (int, float)) \
                    or not 0 < self.test_fraction < 1:
                raise ValueError(f"{PREFIX}test_fraction={self.test_fraction!r} is invalid: must be in (0, 1) or null")
        self._fns = resolve_reward_fns(self.reward_fns, self.reward_weights, self.format_pattern)
        if self.answer_key is None and any(f.builtin and f.name != "format" for f in self._fns):
            raise ValueError(f"{PREFIX}answer_key=None is invalid with the reward "
                             f"{next(f.name for f in self._fns if f.builtin and f.name != 'format')!r}: "
                             f"it needs the gold answer column")
        train = self._load(self.train_path, "train_path")
        test: tuple[Problem, ...] = ()
        if self.test_path is not None:
            test = self._load(self.test_path, "test_path")
        elif self.test_fraction is not None:
            if len(train) < 2:
                raise ValueError(f"{PREFIX}test_fraction={self.test_fraction!r}: {self.train_path} has "
                                 f"{len(train)} row, too few to split")
            order = list(range(len(train)))
            random.Random(self.seed).shuffle(order)
            n_test = min(len(train) - 1, max(1, round(self.test_fraction * len(train))))
            held_out = set(order[:n_test])
            test = tuple(p for i, p in enumerate(train) if i in held_out)
            train = tuple(p for i, p in enumerate(train) if i not in held_out)
        self._splits = {"train": train, "test": test}

    def _load(self, path: str, key: str) -> tuple[Problem, ...]:
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"{PREFIX}{key}={path!r} is invalid: must be a file or directory path")
        return rows_to_problems(read_rows(os.fspath(path), key), os.fspath(path), self.prompt_key, self.answer_key)

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in file order."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> Any:
        """The weighted sum of the reward functions' values for this completion (None if none applies)."""
        return self.group_rewards(problem, [completion])[0]

    def group_rewards(self, problem: Problem, completions: list[str]) -> list[Any]:
        """``reward`` of each of one prompt's completions, with one call of each reward function (as in
        TRL, the prompt and every column are repeated once per completion)."""
        n = len(completions)
        if problem.messages is not None:
            prompts: list = [[dict(m) for m in problem.messages] for _ in range(n)]
            texts: list = [[{"role": "assistant", "content": c}] for c in completions]
        else:
            prompts, texts = [problem.prompt] * n, list(completions)
        columns = {k: [v] * n for k, v in problem.columns.items()}
        return combined_rewards(self._fns, prompts, texts, columns, [problem.answer] * n)

    def allowed_completion_tokens(self, tokenizer) -> None:
        """No restriction: completions are free text."""
        return None

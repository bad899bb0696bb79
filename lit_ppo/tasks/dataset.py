"""The user's own data: local files or a saved dataset directory, rewarded by TRL-style reward functions.

``data=dataset`` reads ``train_path`` (and ``test_path``), offline: a .jsonl / .json / .parquet / .csv
file, or a directory written by ``Dataset.save_to_disk`` (a ``DatasetDict`` directory gives its 'train'
split). Every value arrives as written: a CSV cell is the string in the file (``007`` stays "007"), a
JSON value keeps its JSON type (read by the json module), Parquet and saved datasets (read by the
``datasets`` library, as CSV is) keep their stored types; a reward that wants numbers converts them
(``float(answer)``) or reads numbers stored as such (JSON numbers, Parquet). Each row's
``prompt_key`` column is the prompt (a string, or a list of chat messages {'role', 'content'}), its
``answer_key`` column the gold answer (needed only by the built-ins ``exact_match`` and ``math_verify``),
and every other column goes to the reward functions by name (see lit_ppo.tasks.rewards).
Each reward function is called once per prompt group, with lists of ``gconfig.n_samples`` entries.
One of them, ``accuracy_reward``, decides what evaluation counts as solved.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from lit_ppo.config.checks import check_positive_int, fail, is_number
from lit_ppo.tasks.base import Columns, Problem, split_problems, vocabulary_ids
from lit_ppo.tasks.rewards import (
    CALL_KEYWORDS,
    DEFAULT_FORMAT_PATTERN,
    DEFAULT_REWARD_CONCURRENCY,
    GroupScores,
    RewardCall,
    RewardFunction,
    check_call_signatures,
    resolve_reward_fns,
    score_calls,
)
from lit_ppo.utils.fs import existing_path, user_path

PREFIX = "data.task_kwargs."
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File extension -> its format: JSON is read by the json module, CSV and Parquet by the ``datasets`` builders."""


def read_rows(path: str, key: str) -> list[dict[str, Any]]:
    """The rows of the file or saved dataset directory ``path`` as dicts, read offline, every value as
    written: a CSV cell is the string in the file ("007", "0.50", "" for an empty cell), a JSON value
    keeps its JSON type, Parquet and saved datasets their stored types. ValueError naming ``key`` and
    the file if it is missing, of another kind, not UTF-8 text, unreadable or empty."""
    where = f"{PREFIX}{key}={path!r}"
    p = existing_path(path, where)
    builder = None if p.is_dir() else FILE_FORMATS.get(p.suffix.lower())
    if not p.is_dir() and builder is None:
        raise ValueError(f"{where}: unsupported extension {p.suffix!r}: must be one of "
                         f"{', '.join(FILE_FORMATS)} or a saved dataset directory")
    if builder == "json":
        rows = _json_rows(_utf8_text(p, where), where, lines=p.suffix.lower() == ".jsonl")
    elif builder == "csv":
        rows = _csv_rows(p, _utf8_text(p, where), where)
    else:
        rows = _arrow_rows(p, builder, where)
    if not rows:
        raise ValueError(f"{where}: is empty: no rows")
    return rows


def row_places(path: str, count: int) -> list[str]:
    """Where each of the ``count`` rows that ``read_rows`` read from ``path`` is, as its user finds it: the
    line of a JSON Lines or CSV file (``train.jsonl line 14``), the item of a JSON array, else the row of the
    table (a JSON object of columns, Parquet, a saved ``datasets.Dataset``: ``train.parquet row 12``)."""
    p = user_path(path)
    suffix = "" if p.is_dir() else p.suffix.lower()
    if suffix in (".jsonl", ".json", ".csv"):
        text = p.read_bytes().decode("utf-8-sig")
        document = _json_document(text) if suffix == ".json" else None
        if document is not None:
            kind = "item" if isinstance(document, list) else "row"  # an array, or an object of columns
            return [f"{path} {kind} {i}" for i in range(count)]
        lines = (_csv_record_lines(text)[1:] if suffix == ".csv"  # the header is no row
                 else [n for n, line in enumerate(text.split("\n"), start=1) if line.strip()])
        return [f"{path} line {n}" for n in lines]
    return [f"{path} row {i}" for i in range(count)]


def _json_document(text: str) -> Any:
    """The JSON document ``text`` holds, or None for several (JSON Lines)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _csv_record_lines(text: str) -> list[int]:
    """The line on which each record of the CSV ``text`` begins (a quoted value may span lines), blank lines
    skipped."""
    reader, starts, end = csv.reader(io.StringIO(text)), [], 0
    for record in reader:
        if record:
            starts.append(end + 1)
        end = reader.line_num
    return starts


def _utf8_text(p: Path, where: str) -> str:
    """The file's text; ValueError saying where it is not UTF-8, or that it holds nothing but whitespace."""
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ValueError(f"{where}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")  # a byte order mark is not part of the data
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{where}: is not UTF-8 text at line {line} (byte offset {e.start}, 0x{data[e.start]:02x}: "
                         f"{e.reason}): save the file as UTF-8") from None
    if not text.strip():
        raise ValueError(f"{where}: is empty: no rows" + (" (whitespace only)" if text else " (0 bytes)"))
    return text


def _json_error(where: str, kind: str, e: json.JSONDecodeError, line: int | None = None) -> ValueError:
    return ValueError(f"{where}: cannot be read as {kind} (line {line or e.lineno}, column {e.colno}: {e.msg})")


def _json_rows(text: str, where: str, lines: bool) -> list[dict[str, Any]]:
    """Rows of JSON Lines (one object per line), or of a JSON document holding a list of objects or
    an object of equally long column lists (a .json file may hold JSON Lines too), parsed by the json
    module: pyarrow's reader would cast a column mixing "0" and 2 to one type."""
    if not lines:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # several values: JSON Lines in a .json file
                raise _json_error(where, "json", e) from None
        else:
            if isinstance(document, dict) and document and all(isinstance(v, list) for v in document.values()):
                lengths = {len(v) for v in document.values()}
                if len(lengths) > 1:
                    raise ValueError(f"{where}: cannot be read as json (its columns have different lengths: "
                                     f"{', '.join(f'{k} {len(v)}' for k, v in document.items())})")
                document = [dict(zip(document, values)) for values in zip(*document.values())]
            if not isinstance(document, list):
                raise ValueError(f"{where}: cannot be read as json (it holds {_json_kind(document)}: must be "
                                 f"a list of objects, an object of column lists, or one object per line)")
            for i, row in enumerate(document):
                if not isinstance(row, dict):
                    raise ValueError(f"{where}: cannot be read as json (item {i} is {_json_kind(row)}, "
                                     f"not an object)")
            return _same_columns(document)
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise _json_error(where, "jsonl", e, number) from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: cannot be read as jsonl (line {number} is {_json_kind(row)}, "
                             f"not an object)")
        rows.append(row)
    return _same_columns(rows)


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), "a number")


def _same_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with every column of any row (in order of first appearance), None where a row lacks it."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    if all(len(row) == len(names) for row in rows):
        return rows
    return [{name: row.get(name) for name in names} for row in rows]


def _csv_rows(p: Path, text: str, where: str) -> list[dict[str, Any]]:
    """Rows of a CSV file through the ``datasets`` csv builder, every cell the string in the file:
    pandas' type inference and NA detection are off (they read "007" as 7 and "" as NaN)."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next((row for row in reader if row), [])
        if not any(row for row in reader):  # csv.reader gives [] for a blank line
            raise ValueError(f"{where}: is empty: no rows (a header line only)")
    except csv.Error as e:
        raise ValueError(f"{where}: cannot be read as csv (line {reader.line_num}: {e})") from None
    datasets = _datasets()
    return _load(where, "csv", lambda cache: datasets.load_dataset(
        "csv", data_files=str(p), split="train", cache_dir=cache, keep_in_memory=True,
        converters={i: str for i in range(len(header))}, keep_default_na=False, na_filter=False))


def _arrow_rows(p: Path, builder: str | None, where: str) -> list[dict[str, Any]]:
    """Rows of a Parquet file or a saved dataset directory, with their stored types."""
    datasets = _datasets()
    if builder is None:
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
    return _load(where, builder, lambda cache: datasets.load_dataset(
        builder, data_files=str(p), split="train", cache_dir=cache, keep_in_memory=True))


def _load(where: str, kind: str, load) -> list[dict[str, Any]]:
    """``load(cache_dir)``'s rows, in a temporary cache (none is left behind); ValueError naming the file."""
    with tempfile.TemporaryDirectory(prefix="lit_ppo_dataset_") as cache:
        try:
            return load(cache).to_list()
        except Exception as e:
            cause = e.__cause__ or e
            message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
            raise ValueError(f"{where}: cannot be read as {kind} ({message})") from None


def _datasets():
    """The ``datasets`` module, offline (imported only when the task is used)."""
    # datasets' own switch (read when it is imported), not HF_HUB_OFFLINE: a model may still come from the Hub.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    return datasets


def data_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a data file's bytes, or of a directory's files (each one's relative path and bytes,
    in sorted order): what a resumed run compares to tell whether its data changed."""
    p = user_path(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    # Keyed by size and modification time: a checkpoint records it at every save, the bytes are read once.
    stamps = tuple((f.relative_to(p).as_posix() if f != p else "", f.stat().st_size, f.stat().st_mtime_ns)
                   for f in files)
    return _digest(str(p.resolve()), stamps)


@functools.lru_cache(maxsize=8)
def _digest(path: str, stamps: tuple) -> str:
    root = Path(path)
    digest = hashlib.sha256()
    for name, _, _ in stamps:
        digest.update(name.encode() + b"\0")
        with open(root / name if name else root, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _messages(value: Any) -> tuple[dict[str, str], ...] | None:
    """``value`` as chat messages if it is a non-empty list of {'role': str, 'content': str}, else None."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return None
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def rows_to_problems(rows: list[dict[str, Any]], path: str, prompt_key: str, answer_key: str | None,
                     answer_needed_by: str | None = None, key: str = "train_path") -> tuple[Problem, ...]:
    """Problems of the rows read from ``path`` (the setting ``key``); ValueError naming the key, the file and
    the column for a missing column, and the row's line (``row_places``) for a value of the wrong kind. The
    gold answer is read from ``answer_key`` if the column is there; it must be when the reward
    ``answer_needed_by`` needs it (else the answer is "")."""
    if not rows:
        raise ValueError(f"{path}: has no rows")
    names = list(rows[0])
    if prompt_key not in names:
        raise ValueError(f"{PREFIX}prompt_key={prompt_key!r}: {path} has no column {prompt_key!r}; "
                         f"columns: {', '.join(names)}")
    if answer_key is not None and answer_key not in names:
        if answer_needed_by is not None:
            raise ValueError(f"{PREFIX}answer_key={answer_key!r}: {path} has no column {answer_key!r}, which the "
                             f"reward {answer_needed_by!r} compares with; columns: {', '.join(names)}")
        answer_key = None
    clashing = [name for name in names if name in CALL_KEYWORDS and name != prompt_key]
    if clashing:
        raise ValueError(f"{PREFIX}{key}={path!r}: has a column {clashing[0]!r}, a keyword reward functions are "
                         f"called with ({', '.join(CALL_KEYWORDS)}): rename the column")
    def place(i: int) -> str:  # read again only for the message: the row's line in the file
        return row_places(path, len(rows))[i]

    problems = []
    for i, row in enumerate(rows):
        value = row[prompt_key]
        messages = None if isinstance(value, str) else _messages(value)
        if not isinstance(value, str) and messages is None:
            raise ValueError(f"{PREFIX}prompt_key={prompt_key!r}: {place(i)}, column {prompt_key!r}: "
                             f"{type(value).__name__} is not a string or a list of chat messages {{role, content}}")
        if messages is not None and not any(m["role"] == "user" for m in messages):
            raise ValueError(f"{PREFIX}prompt_key={prompt_key!r}: {place(i)}, column {prompt_key!r}: "
                             f"the chat messages have no 'user' message")
        prompt = value if messages is None else [m["content"] for m in messages if m["role"] == "user"][-1]
        answer = ""
        if answer_key is not None:
            gold = row[answer_key]
            if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
                if answer_needed_by is None:  # no built-in compares with it: a column like any other
                    gold = ""
                else:
                    raise ValueError(f"{PREFIX}answer_key={answer_key!r}: {place(i)}, column {answer_key!r}: "
                                     f"{type(gold).__name__} is not a string or a number")
            # A column of ints and floats is read as floats: 2 stays "2", not "2.0".
            answer = str(int(gold)) if isinstance(gold, float) and gold.is_integer() else str(gold)
        columns = Columns({k: v for k, v in row.items() if k != prompt_key})
        problems.append(Problem(prompt=prompt, answer=answer, messages=messages, columns=columns))
    return tuple(problems)


def held_out_split(train: tuple[Problem, ...], fraction: float | None, seed: int,
                   path: str) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    """``(train, test)``: ``fraction`` of the problems (at least one), chosen with ``seed``, held out as the test
    split, the others kept in order; None: all of them and no test split."""
    if fraction is None:
        return train, ()
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"{PREFIX}test_fraction={fraction!r} is invalid: must be in (0, 1) or null")
    if len(train) < 2:
        raise ValueError(f"{PREFIX}test_fraction={fraction!r}: {path} has {len(train)} row, too few to split")
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    held_out = set(order[:min(len(train) - 1, max(1, round(fraction * len(train))))])
    return (tuple(p for i, p in enumerate(train) if i not in held_out),
            tuple(p for i, p in enumerate(train) if i in held_out))


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
    column, to every reward function by its name). Only ``exact_match`` and ``math_verify`` need it:
    without them the column may be missing. None: no answer column."""
    reward_fns: list[str] = field(default_factory=lambda: ["math_verify"])
    """Rewards (TRL's ``reward_funcs``): built-in names (exact_match, math_verify, format), dotted paths
    module.function importable from the working directory, called as TRL calls them
    (``fn(prompts=, completions=, completion_ids=, trainer_state=, **columns) -> list[float | None]``),
    reward model directories (set up by ``reward_model``) and ``judge`` (set up by ``judge``)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (TRL's ``reward_weights``); None: all 1.0. A sample's reward is the
    weighted sum over the functions that returned a number; None from every function is an invalid reward."""
    accuracy_reward: str | None = None
    """The reward function whose value decides what evaluation counts as solved (``eval/accuracy``,
    pass@k, mean@k: its value reaches ``eval.success_threshold``), as written in ``reward_fns`` or by its
    metric name. None: the only function, else the first whose name does not contain "format"."""
    reward_concurrency: int = DEFAULT_REWARD_CONCURRENCY
    """Calls of ``async def`` reward functions awaited at once: a batch's groups are scored together, so a
    slow reward (a judge, a remote service) does not serialise the batch."""
    reward_timeout_s: float | None = None
    """Seconds one call of an ``async def`` reward function may take; past it the run stops, naming the
    function and the prompt. None: no limit."""
    reward_model: dict[str, Any] | None = None
    """Settings of the reward model directories in ``reward_fns`` (``lit_ppo.tasks.rewards.model.RewardModelConfig``:
    device, dtype, batch_size, max_length, label, mean, std, squash, offload); None: the defaults."""
    judge: dict[str, Any] | None = None
    """Settings of the ``judge`` entry of ``reward_fns`` (``lit_ppo.tasks.rewards.judge.JudgeConfig``: the
    model, its endpoint, the prompt template and the verdict rule); None: no judge."""
    format_pattern: str = DEFAULT_FORMAT_PATTERN
    """The regular expression of the built-in ``format`` reward (searched anywhere in the completion)."""
    completion_tokens: list[str] | None = None
    """The vocabulary entries completions are made of (a label set such as ``[yes, no]``, the digits),
    the tokenizer's EOS added; with ``gconfig.restrict_to_task_tokens=true`` sampling and the trainer's
    log-probs use only these. Numbers are taken as written (``[0, 1]`` is the tokens "0" and "1").
    None: free text."""

    _fns: tuple[RewardFunction, ...] = field(init=False, repr=False, compare=False)
    _accuracy: RewardFunction = field(init=False, repr=False, compare=False)
    """The function ``accuracy_reward`` resolves to."""
    _needs_answer: str | None = field(init=False, repr=False, compare=False)
    """The first configured reward that compares with the gold answer, or None."""
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
        tokens = self.completion_tokens
        if tokens is not None:
            if (not isinstance(tokens, (list, tuple)) or not tokens
                    or not all(isinstance(t, (str, int)) and not isinstance(t, bool) and str(t) for t in tokens)):
                raise ValueError(f"{PREFIX}completion_tokens={tokens!r} is invalid: must be a non-empty list of "
                                 f"vocabulary entries (strings) or null")
            self.completion_tokens = [str(t) for t in tokens]
        check_positive_int(f"{PREFIX}reward_concurrency", self.reward_concurrency)
        if self.reward_timeout_s is not None and (not is_number(self.reward_timeout_s)
                                                  or not self.reward_timeout_s > 0):
            fail(f"{PREFIX}reward_timeout_s", self.reward_timeout_s, "a number of seconds > 0 or null")
        self._fns = resolve_reward_fns(self.reward_fns, self.reward_weights, self.format_pattern,
                                       reward_model=self.reward_model, judge=self.judge)
        self._accuracy = self._accuracy_function()
        self._needs_answer = next((f.name for f in self._fns if f.needs_answer), None)
        if self.answer_key is None and self._needs_answer is not None:
            raise ValueError(f"{PREFIX}answer_key=None is invalid with the reward {self._needs_answer!r}: "
                             f"it needs the gold answer column")
        train = self._load(self.train_path, "train_path")
        test: tuple[Problem, ...] = ()
        if self.test_path is not None:
            test = self._load(self.test_path, "test_path")
        else:
            train, test = held_out_split(train, self.test_fraction, self.seed, self.train_path)
        self._splits = {"train": train, "test": test}

    def _accuracy_function(self) -> RewardFunction:
        """The function ``accuracy_reward`` names, or its default; ValueError naming the key when it names
        none of ``reward_fns``, or when there is no default."""
        if self.accuracy_reward is not None:
            for f in self._fns:
                if self.accuracy_reward in (f.name, f.metric):
                    return f
            raise ValueError(f"{PREFIX}accuracy_reward={self.accuracy_reward!r} is not one of the reward functions: "
                             f"allowed: {', '.join(f.metric for f in self._fns)}")
        if len(self._fns) == 1:
            return self._fns[0]
        for f in self._fns:
            if "format" not in f.metric:
                return f
        raise ValueError(f"{PREFIX}accuracy_reward is needed: every reward function is a format reward "
                         f"({', '.join(f.metric for f in self._fns)}); name the one whose value decides what "
                         f"evaluation counts as solved")

    @property
    def reward_names(self) -> tuple[str, ...]:
        """The reward functions' metric names, in configured order (``GroupScores.terms``)."""
        return tuple(f.metric for f in self._fns)

    @property
    def term_weights(self) -> tuple[float, ...]:
        """Each reward function's weight, in the order of ``reward_names`` (1.0 where reward_weights is None)."""
        return tuple(f.weight for f in self._fns)

    @property
    def accuracy_term(self) -> str:
        """The metric name of the function that decides what evaluation counts as solved."""
        return self._accuracy.metric

    def _load(self, path: str, key: str) -> tuple[Problem, ...]:
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"{PREFIX}{key}={path!r} is invalid: must be a file or directory path")
        problems = rows_to_problems(read_rows(os.fspath(path), key), os.fspath(path), self.prompt_key,
                                    self.answer_key, self._needs_answer, key)
        check_call_signatures(self._fns, list(problems[0].columns))
        return problems

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in file order."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> Any:
        """The weighted sum of the reward functions' values for this completion text (None if none applies),
        scored without its tokens (``completion_ids`` is ``[[]]``) at step 0."""
        return self.score_group(problem, [completion], [[]], 0).rewards[0]

    def score_group(self, problem: Problem, completions: list[str], completion_ids: list[list[int]],
                    step: int) -> GroupScores:
        """The rewards of one prompt's completions (their texts and token ids, sampled at iteration ``step``)."""
        return self.score_groups([problem], [completions], [completion_ids], step)[0]

    def score_groups(self, problems: list[Problem], completions: list[list[str]], completion_ids: list[list[list[int]]],
                     step: int) -> list[GroupScores]:
        """The rewards of several prompts' completions, one call of each reward function per prompt (as in TRL,
        the prompt and every column are repeated once per completion); the asynchronous ones' calls awaited
        together, ``reward_concurrency`` at once, each within ``reward_timeout_s``."""
        calls = []
        for problem, texts, ids in zip(problems, completions, completion_ids, strict=True):
            n = len(texts)
            if problem.messages is not None:
                prompts: list = [[dict(m) for m in problem.messages] for _ in range(n)]
                shown: list = [[{"role": "assistant", "content": c}] for c in texts]
            else:
                prompts, shown = [problem.prompt] * n, list(texts)
            columns = {k: [v] * n for k, v in problem.columns.items()}
            calls.append(RewardCall(prompts, shown, [list(i) for i in ids], columns, [problem.answer] * n))
        return score_calls(self._fns, calls, step, concurrency=self.reward_concurrency,
                           timeout_s=self.reward_timeout_s)

    def allowed_completion_tokens(self, tokenizer) -> list[int] | None:
        """Ids of ``completion_tokens`` and the tokenizer's EOS; None (free text) without them."""
        if self.completion_tokens is None:
            return None
        return vocabulary_ids(tokenizer, self.completion_tokens, f"{PREFIX}completion_tokens")

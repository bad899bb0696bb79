"""GSM8K-format problems from local files, rewarded by math-verify equivalence.

Each record has ``question`` and ``answer`` = "rationale ... #### 42" (GSM8K's format). The prompt
asks for a ``\\boxed{}`` answer; the reward is 1.0 iff math-verify judges the completion
equivalent to the number after "####" (default math-verify settings; 0.0 on any error or after
``timeout_s``), so "\\boxed{1/2}" matches "#### 0.5". Nothing is downloaded: point ``train_path``
at a .jsonl or .parquet file.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from lit_ppo.tasks.base import Problem, split_problems
from lit_ppo.utils.fs import user_path

FIELDS = ("question", "answer")
INSTRUCTION = "Please put your final answer within \\boxed{}."


def _read_records(path: Path) -> list[dict]:
    """The rows of a .jsonl or .parquet file as dicts; ValueError naming the file otherwise."""
    if not path.is_file():
        raise ValueError("no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = []
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {line_no} is not valid JSON ({e})") from e
        return records
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # present with mlflow; imported only when needed

        return pq.read_table(path).to_pylist()
    raise ValueError(f"unsupported extension {suffix!r} (use .jsonl or .parquet)")


def _gold_number(answer: str) -> str:
    """The number after the last '####', thousands separators removed ("1,200" -> "1200")."""
    _, sep, tail = answer.rpartition("####")
    number = tail.strip().replace(",", "")
    if not sep or not number:
        raise ValueError("has no final answer after '####'")
    return number


def load_problems(path: str | Path, key: str = "path") -> tuple[Problem, ...]:
    """GSM8K records of ``path`` as Problems: the question plus the boxed-answer instruction,
    and the gold number after '####'. Errors name ``key``, the setting that gave the path."""
    path = user_path(path)
    problems = []
    try:
        records = _read_records(path)
    except ValueError as e:
        raise ValueError(f"data.task_kwargs.{key}={str(path)!r}: {e}") from None
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record {i} is not an object with fields {', '.join(FIELDS)}")
        for name in FIELDS:
            if not isinstance(record.get(name), str):
                raise ValueError(f"{path}: record {i} lacks the string field {name!r}")
        try:
            gold = _gold_number(record["answer"])
        except ValueError as e:
            raise ValueError(f"{path}: record {i}: field 'answer' {e}") from None
        problems.append(Problem(prompt=f"{record['question']}\n{INSTRUCTION}", answer=gold))
    return tuple(problems)


def math_equal(gold: str, completion: str) -> bool:
    """math-verify's judgement that ``completion`` states ``gold``, exceptions counted as False.

    math-verify's own timeouts use SIGALRM, which raises off the main thread (rollouts may run in
    a background thread), so they are disabled here; ``GSM8KTask.reward`` bounds the time instead.
    """
    import math_verify  # pulls in sympy: imported only when a reward is computed

    try:
        parsed_gold = math_verify.parse(gold, parsing_timeout=None)
        parsed = math_verify.parse(completion, parsing_timeout=None)
        return bool(math_verify.verify(parsed_gold, parsed, timeout_seconds=None))
    except Exception:
        return False


@dataclass
class GSM8KTask:
    """GSM8K-style word problems from local files with a math-verify reward."""

    name: ClassVar[str] = "gsm8k"

    train_path: str
    """A .jsonl or .parquet file with string fields 'question' and 'answer' ("... #### 42")."""
    test_path: str | None = None
    """The same for the 'test' split; None: the 'test' split is empty."""
    timeout_s: float | None = 5.0
    """Seconds one reward may take before it counts as 0.0 (None: no limit). Sympy can stall on
    adversarial text; the check then runs on in a daemon thread but training goes on."""

    _splits: dict[str, tuple[Problem, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} is invalid: must be > 0 or null")
        # Loaded eagerly so that a wrong path or field fails before any model loads.
        self._splits = {
            "train": load_problems(self.train_path, "train_path"),
            "test": load_problems(self.test_path, "test_path") if self.test_path is not None else (),
        }

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of 'train' or 'test', in file order."""
        return split_problems(self._splits, split)

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if math-verify judges the completion equivalent to the gold number, else 0.0
        (also on any error or after ``timeout_s``)."""
        if self.timeout_s is None:
            return float(math_equal(problem.answer, completion))
        # A thread per call, not a shared pool: a stalled check must not block later ones.
        result: list[bool] = []
        worker = threading.Thread(target=lambda: result.append(math_equal(problem.answer, completion)),
                                  daemon=True, name="gsm8k-reward")
        worker.start()
        worker.join(self.timeout_s)
        return 1.0 if result and result[0] else 0.0

    def allowed_completion_tokens(self, tokenizer) -> None:
        """No restriction: completions are free text."""
        return None

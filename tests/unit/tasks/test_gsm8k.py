"""The GSM8K task (``lit_ppo.tasks.gsm8k``): loading from JSONL and Parquet, the math-verify reward (off the
main thread too, and timed out), and file errors."""

from __future__ import annotations

import json
import threading
import time

import pytest

from lit_ppo.tasks import GSM8KTask
from lit_ppo.tasks.base import Problem, Task
from tests.unit.tasks.helpers import GSM8K_SAMPLE, char_tokenizer

GOLDS = ["22", "132", "0.5", "1200", "16"]


def test_gsm8k_jsonl_loading():
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE))
    problems = task.problems("train")
    assert [p.answer for p in problems] == GOLDS
    rows = [json.loads(line) for line in GSM8K_SAMPLE.read_text().splitlines()]
    for p, row in zip(problems, rows):
        assert p.prompt == row["question"] + "\nPlease put your final answer within \\boxed{}."
    assert task.problems("test") == ()
    assert isinstance(task, Task) and task.allowed_completion_tokens(char_tokenizer()) is None


def test_gsm8k_parquet_twin(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in GSM8K_SAMPLE.read_text().splitlines()]
    path = tmp_path / "gsm8k_sample.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE), test_path=str(path))
    assert task.problems("test") == task.problems("train")
    assert [p.answer for p in task.problems("test")] == GOLDS


@pytest.mark.parametrize(
    "gold, completion, expected",
    [("42", "The answer is \\boxed{42}", 1.0), ("42", "41", 0.0), ("42", "", 0.0),
     ("42", "\\boxed{41}", 0.0), ("0.5", "So it is \\boxed{\\frac{1}{2}}.", 1.0), ("0.5", "1/2", 1.0),
     ("1200", "\\boxed{1,200}", 1.0), ("16", "She has 16 marbles.", 1.0), ("16", "}}}{{\\frac", 0.0)],
)
def test_gsm8k_reward(gold, completion, expected):
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE))
    assert task.reward(Problem("q", gold), completion) == expected


def test_gsm8k_reward_on_fixture_problems():
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE))
    for p in task.problems("train"):
        assert task.reward(p, f"Work.\nThe final answer is \\boxed{{{p.answer}}}.") == 1.0
        assert task.reward(p, "\\boxed{7}") == 0.0


def test_gsm8k_reward_off_the_main_thread():
    # math-verify's default SIGALRM timeouts raise off the main thread (which would read as 0.0)
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE), timeout_s=None)
    out = []
    worker = threading.Thread(target=lambda: out.append(task.reward(Problem("q", "42"), "\\boxed{42}")))
    worker.start()
    worker.join()
    assert out == [1.0]


def test_gsm8k_reward_times_out(monkeypatch):
    import math_verify

    monkeypatch.setattr(math_verify, "verify", lambda *a, **k: time.sleep(1.5) or True)
    task = GSM8KTask(train_path=str(GSM8K_SAMPLE), timeout_s=0.1)
    start = time.monotonic()
    assert task.reward(Problem("q", "42"), "\\boxed{42}") == 0.0
    assert time.monotonic() - start < 1.0


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_missing_field(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "q?", "answer": "#### 1"}, {"question": "q2?"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl.*record 1.*'answer'"):
        GSM8KTask(train_path=path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "q?", "answer": "#### 1"}]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet.*'question'"):
        GSM8KTask(train_path=str(GSM8K_SAMPLE), test_path=str(tmp_path / "bad.parquet"))


def test_gsm8k_file_errors(tmp_path):
    with pytest.raises(ValueError, match="data.task_kwargs.train_path=.*missing.jsonl.*: no such file"):
        GSM8KTask(train_path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"data\.csv.*\.jsonl or \.parquet"):
        GSM8KTask(train_path=str(tmp_path / "data.csv"))
    path = _write_jsonl(tmp_path / "nohash.jsonl", [{"question": "q?", "answer": "it is 4"}])
    with pytest.raises(ValueError, match=r"nohash\.jsonl.*####"):
        GSM8KTask(train_path=path)
    (tmp_path / "broken.jsonl").write_text('{"question": "q?", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl.*line 2"):
        GSM8KTask(train_path=str(tmp_path / "broken.jsonl"))

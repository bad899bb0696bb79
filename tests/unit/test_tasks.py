"""Tasks: problem generation/loading, reward tables, allowed tokens, the task registry."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from lit_ppo.tasks import TASKS, ArithmeticTask, GSM8KTask, ReasoningGymTask, build_task
from lit_ppo.tasks.base import Problem, Task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GSM8K_SAMPLE = FIXTURES / "gsm8k_sample.jsonl"
PROMPT_RE = re.compile(r"(\d+)([+\-*])(\d+)=")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def char_tokenizer(chars: str = "0123456789+-*= "):
    """A character-level tokenizer like the tiny model's: one token per char, EOS '<|end|>'."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", "<|end|>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>", unk_token="<unk>")


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("kwargs", [{}, {"operators": ["+", "-", "*"], "max_operand": 12, "modulus": 7}])
def test_arithmetic_answers_are_correct(kwargs):
    task = ArithmeticTask(seed=1, num_train=500, num_test=50, **kwargs)
    for split, n in (("train", 500), ("test", 50)):
        problems = task.problems(split)
        assert len(problems) == n
        for p in problems:
            m = PROMPT_RE.fullmatch(p.prompt)
            assert m, p.prompt
            a, op, b = int(m[1]), m[2], int(m[3])
            assert 0 <= a <= task.max_operand and 0 <= b <= task.max_operand
            assert op in task.operators
            assert p.answer == str(OPS[op](a, b) % task.modulus)


def test_arithmetic_default_is_one_digit_addition():
    task = ArithmeticTask()
    problems = task.problems("train")
    assert len(problems) == 10_000
    assert {PROMPT_RE.fullmatch(p.prompt)[2] for p in problems} == {"+"}
    assert {p.answer for p in problems} == set("0123456789")
    # all 100 operand pairs show up: the sampler covers the whole problem space
    assert len({p.prompt for p in problems}) == 100


def test_arithmetic_deterministic_per_seed():
    a, b = ArithmeticTask(seed=7, num_train=200), ArithmeticTask(seed=7, num_train=200)
    c = ArithmeticTask(seed=8, num_train=200)
    assert a.problems("train") == b.problems("train")
    assert a.problems("test") == b.problems("test")
    assert a.problems("train") != c.problems("train")
    assert a.problems("train")[:50] != a.problems("test")[:50]  # independent streams per split


@pytest.mark.parametrize(
    "completion, expected",
    [("7", 1.0), (" 7\n", 1.0), ("3", 0.1), ("  0 ", 0.1), ("77", 0.0), ("7+", 0.0), ("", 0.0),
     ("seven", 0.0), ("7 7", 0.0), ("-7", 0.0)],
)
def test_arithmetic_reward_table(completion, expected):
    task = ArithmeticTask(num_train=1, num_test=0)
    assert task.reward(Problem("3+4=", "7"), completion) == expected


def test_arithmetic_format_credit_and_width():
    assert ArithmeticTask(num_train=1, format_credit=0.0).reward(Problem("3+4=", "7"), "3") == 0.0
    wide = ArithmeticTask(num_train=1, modulus=100, max_operand=99)
    assert wide.reward(Problem("30+12=", "42"), "42") == 1.0
    assert wide.reward(Problem("30+12=", "42"), "41") == 0.1  # two digits are well-formed here
    assert wide.reward(Problem("30+12=", "42"), "421") == 0.0


def test_arithmetic_allowed_tokens():
    tok = char_tokenizer()
    task = ArithmeticTask(num_train=1)
    ids = task.allowed_completion_tokens(tok)
    assert len(ids) == 11 and len(set(ids)) == 11
    assert ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|end|>")
    assert [tok.decode([i]) for i in ids[:-1]] == list("0123456789")
    assert tok.convert_tokens_to_ids("+") not in ids


def test_arithmetic_allowed_tokens_names_a_missing_digit():
    with pytest.raises(ValueError, match="'5'"):
        ArithmeticTask(num_train=1).allowed_completion_tokens(char_tokenizer("012346789+="))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"modulus": 1}, "modulus"), ({"operators": ["/"]}, "operators"), ({"operators": []}, "operators"),
     ({"format_credit": 1.0}, "format_credit"), ({"num_train": -1}, "num_train")],
)
def test_arithmetic_config_errors(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArithmeticTask(**kwargs)


def test_arithmetic_unknown_split():
    with pytest.raises(ValueError, match="split"):
        ArithmeticTask(num_train=1).problems("validation")


# ---------------------------------------------------------------- reasoning-gym


@pytest.fixture(scope="module")
def gsm_symbolic():
    return ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=3, test_size=5)


def test_gsm_symbolic_protocol_and_prompts(gsm_symbolic):
    assert isinstance(gsm_symbolic, Task) and gsm_symbolic.name == "gsm_symbolic"
    assert gsm_symbolic.allowed_completion_tokens(char_tokenizer()) is None
    assert len(gsm_symbolic.problems("train")) == 20 and len(gsm_symbolic.problems("test")) == 5
    for p in gsm_symbolic.problems("train"):
        assert "<answer>" in p.prompt and "</answer>" in p.prompt  # the format instruction
        assert re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.answer  # gsm_symbolic golds are numbers


def test_gsm_symbolic_reward(gsm_symbolic):
    for split in ("train", "test"):
        for p in gsm_symbolic.problems(split):
            assert gsm_symbolic.reward(p, f"Some steps.\n<answer>{p.answer}</answer>") == 1.0
            assert gsm_symbolic.reward(p, f"<answer> {p.answer} </answer>") == 1.0
    p = gsm_symbolic.problems("train")[0]
    wrong = str(int(float(p.answer)) + 1)
    assert gsm_symbolic.reward(p, f"<answer>{wrong}</answer>") < 0.1  # dataset's own scale: 0.01
    assert gsm_symbolic.reward(p, "<answer>no idea</answer>") == 0.0
    assert gsm_symbolic.reward(p, f"The answer is {p.answer}.") == 0.0  # no tags: nothing extracted
    assert gsm_symbolic.reward(p, "") == 0.0
    # the last answer tag counts, as in reasoning-gym's extract_answer
    assert gsm_symbolic.reward(p, f"<answer>{wrong}</answer> no, <answer>{p.answer}</answer>") == 1.0
    assert gsm_symbolic.reward(p, f"<answer>{p.answer}</answer> no, <answer>{wrong}</answer>") < 0.1


def test_gsm_symbolic_deterministic_per_seed(gsm_symbolic):
    same = ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=3, test_size=5)
    other = ReasoningGymTask(dataset="gsm_symbolic", size=20, seed=4, test_size=5)
    assert same.problems("train") == gsm_symbolic.problems("train")
    assert same.problems("test") == gsm_symbolic.problems("test")
    assert other.problems("train") != gsm_symbolic.problems("train")
    assert not set(gsm_symbolic.problems("test")) & set(gsm_symbolic.problems("train"))


def test_reasoning_gym_reward_needs_own_problem(gsm_symbolic):
    with pytest.raises(ValueError, match="not one of this task"):
        gsm_symbolic.reward(Problem("What is 1+1?", "2"), "<answer>2</answer>")


def test_reasoning_gym_any_dataset():
    task = ReasoningGymTask(dataset="basic_arithmetic", size=10, seed=0, test_size=10,
                            dataset_kwargs={"min_terms": 2, "max_terms": 2})
    assert task.name == "basic_arithmetic"
    # this generator seeds entry i with seed + i: a test seed of seed + 1 would repeat 9 of 10
    assert not set(task.problems("test")) & set(task.problems("train"))
    assert ReasoningGymTask(dataset="basic_arithmetic", size=10, test_size=0).problems("test") == ()
    for p in task.problems("train"):
        assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0
        assert task.reward(p, "<answer>x</answer>") == 0.0


def test_reasoning_gym_config_errors():
    with pytest.raises(ValueError, match="gsm_symbolic") as err:  # close match suggested
        ReasoningGymTask(dataset="gsm_symbolc")
    assert "available" in str(err.value)
    with pytest.raises(ValueError, match="basic_arithmetic"):
        ReasoningGymTask(dataset="basic_arithmetic", dataset_kwargs={"no_such_field": 1})
    with pytest.raises(ValueError, match="prompt_style"):
        ReasoningGymTask(dataset="gsm_symbolic", prompt_style="nope")


# ---------------------------------------------------------------- gsm8k

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


# ---------------------------------------------------------------- registry


def test_registry_names():
    assert TASKS.names() == ["arithmetic", "calculator", "dataset", "gsm8k", "gsm_symbolic", "reasoning_gym", "word_problems"]


def test_build_task():
    assert build_task("arithmetic", seed=5, num_train=30).problems("train") == \
        ArithmeticTask(seed=5, num_train=30).problems("train")
    task = build_task("gsm_symbolic", size=4, test_size=1, seed=3)
    assert isinstance(task, ReasoningGymTask) and task.name == "gsm_symbolic"
    task = build_task("reasoning_gym", dataset="basic_arithmetic", size=3, test_size=1)
    assert task.name == "basic_arithmetic"
    assert build_task("gsm8k", train_path=str(GSM8K_SAMPLE)).problems("train")[0].answer == "22"


def test_build_task_errors():
    with pytest.raises(ValueError, match="data.task='math' is invalid: unknown task 'math'; registered: arithmetic, "
                                         "calculator, dataset, gsm8k, gsm_symbolic, reasoning_gym, word_problems, or a dotted path"):
        build_task("math")
    with pytest.raises(ValueError, match="data.task_kwargs.no_such_option is not a key of task 'arithmetic'"):
        build_task("arithmetic", no_such_option=1)

"""Unit tests for ``data=dataset`` (lit_ppo.tasks.dataset), its reward functions (lit_ppo.tasks.rewards)
and custom task classes by dotted path (lit_ppo.tasks.build_task)."""

from __future__ import annotations

import json
import math
import pickle
import sys
import textwrap

import pytest

from lit_ppo.config import RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.episode import checked_reward
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks import DatasetTask, build_task
from lit_ppo.tasks.base import Columns, Problem, Task
from lit_ppo.tasks.rewards import completion_text, exact_match, format_reward, math_verify
from lit_ppo.utils.imports import ensure_cwd_importable

ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "level": i % 3, "source": f"s{i}"} for i in range(10)]
CALLS: list[dict] = []


def recording(prompts, completions, **columns):
    """A TRL-style reward function that records its arguments: 1.0 for the exact answer."""
    CALLS.append({"prompts": prompts, "completions": completions, **columns})
    return [float(completion_text(c) == a) for c, a in zip(completions, columns["answer"])]


def half(prompts, completions, **kwargs):
    return [0.5 for _ in completions]


def not_applicable(prompts, completions, **kwargs):
    return [None for _ in completions]


def raises(prompts, completions, **kwargs):
    raise KeyError("solution")


def too_many(prompts, completions, **kwargs):
    return [1.0, 1.0, 1.0]


def returns_nan(prompts, completions, **kwargs):
    return [math.nan for _ in completions]


HERE = __name__


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def write(path, rows=ROWS):
    """``rows`` written to ``path`` in the format its extension names (a directory: save_to_disk)."""
    import datasets

    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif path.suffix == ".csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize("name", ["train.jsonl", "train.json", "train.parquet", "train.csv", "saved"])
def test_every_format_reads_prompts_answers_and_columns(tmp_path, name):
    task = DatasetTask(train_path=write(tmp_path / name), reward_fns=["exact_match"])
    problems = task.problems("train")
    assert [p.prompt for p in problems] == [r["prompt"] for r in ROWS]
    assert [p.answer for p in problems] == [r["answer"] for r in ROWS]
    # a csv cell is the string in the file; the other formats keep their stored types
    assert dict(problems[3].columns) == {"answer": "6", "level": "0" if name.endswith(".csv") else 0, "source": "s3"}
    assert task.problems("test") == ()
    assert isinstance(task, Task) and task.name == "dataset"


def test_saved_dataset_dict_gives_its_train_split(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                          "other": datasets.Dataset.from_list(ROWS[4:])}).save_to_disk(str(tmp_path / "dd"))
    task = DatasetTask(train_path=str(tmp_path / "dd"), reward_fns=["exact_match"])
    assert [p.answer for p in task.problems("train")] == ["0", "2", "4", "6"]


def test_numeric_answers_become_strings(tmp_path):
    rows = [{"prompt": "1+1=", "answer": 2}, {"prompt": "half", "answer": 0.5}]
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl", rows), reward_fns=["exact_match"])
    assert [p.answer for p in task.problems("train")] == ["2", "0.5"]
    assert task.reward(task.problems("train")[0], " 2\n") == 1.0


def test_other_prompt_and_answer_keys(tmp_path):
    rows = [{"question": "q1", "solution": "a1", "prompt": "ignored?"}]
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl", rows), prompt_key="question", answer_key="solution",
                       reward_fns=[f"{HERE}.recording"])
    (p,) = task.problems("train")
    assert (p.prompt, p.answer) == ("q1", "a1")
    assert dict(p.columns) == {"solution": "a1", "prompt": "ignored?"}


def test_messages_prompt_reaches_the_chat_template_as_messages(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    rows = [{"prompt": chat, "answer": "4"}, {"prompt": chat[1:], "answer": "4"}]
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl", rows), reward_fns=[f"{HERE}.recording"])
    first, second = task.problems("train")
    assert first.prompt == "2+2?" and first.messages == tuple(chat)

    class RecordingTokenizer:
        pad_token_id, eos_token_id = 0, 1
        seen: list = []

        def apply_chat_template(self, messages, **kwargs):
            self.seen.append(messages)
            return [5, 6]

    tok = RecordingTokenizer()
    wf = SingleTurnWorkflow(tok, task, SamplingParams(n=1, max_new_tokens=2), RolloutConfig(system_prompt="default"))
    assert wf.prompt_ids(first) == [5, 6]
    wf.prompt_ids(second)
    wf.prompt_ids(Problem(prompt="plain", answer=""))
    assert tok.seen == [chat, [{"role": "system", "content": "default"}, chat[1]],
                        [{"role": "system", "content": "default"}, {"role": "user", "content": "plain"}]]
    # TRL's conversational form: prompts and completions are message lists.
    assert task.reward(first, "4") == 1.0
    assert CALLS[-1]["prompts"] == [chat] and CALLS[-1]["completions"] == [[{"role": "assistant", "content": "4"}]]


def test_problems_pickle(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=["exact_match"])
    p = task.problems("train")[0]
    assert pickle.loads(pickle.dumps(p)) == p
    assert isinstance(p.columns, Columns)


# ---------------------------------------------------------------- splits


def test_test_path(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "a.jsonl", ROWS[:6]), test_path=write(tmp_path / "b.csv", ROWS[6:]),
                       reward_fns=["exact_match"])
    assert [p.answer for p in task.problems("test")] == ["12", "14", "16", "18"]
    assert len(task.problems("train")) == 6


def test_test_fraction_is_a_seeded_disjoint_split(tmp_path):
    path = write(tmp_path / "t.jsonl")
    a = DatasetTask(train_path=path, test_fraction=0.3, seed=1, reward_fns=["exact_match"])
    b = DatasetTask(train_path=path, test_fraction=0.3, seed=1, reward_fns=["exact_match"])
    c = DatasetTask(train_path=path, test_fraction=0.3, seed=2, reward_fns=["exact_match"])
    assert a.problems("test") == b.problems("test") and len(a.problems("test")) == 3
    assert a.problems("test") != c.problems("test")
    train, test = {p.prompt for p in a.problems("train")}, {p.prompt for p in a.problems("test")}
    assert not train & test and len(train | test) == 10
    order = [p.prompt for p in a.problems("train")]
    assert order == sorted(order, key=lambda s: int(s.split("+")[0]))  # file order kept


# ---------------------------------------------------------------- rewards


def test_extra_columns_reach_the_reward_function(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.recording"])
    p = task.problems("train")[4]
    assert task.reward(p, "8") == 1.0 and task.reward(p, "9") == 0.0
    state = CALLS[0].pop("trainer_state")
    assert state.global_step == 0
    assert CALLS[0] == {"prompts": ["4+4="], "completions": ["8"], "completion_ids": [[]], "answer": ["8"],
                        "level": [1], "source": ["s4"]}


def test_weighted_sum_skips_not_applicable(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_weights=[2.0, 0.5, 10.0],
                       reward_fns=["exact_match", f"{HERE}.half", f"{HERE}.not_applicable"])
    p = task.problems("train")[1]
    assert task.reward(p, "2") == 2.0 + 0.25
    assert task.reward(p, "3") == 0.25


def test_all_not_applicable_is_an_invalid_reward(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.not_applicable"])
    p = task.problems("train")[0]
    value = task.reward(p, "0")
    assert value is None
    with pytest.raises(RunStopped, match="returned reward None .*not a real number"):
        checked_reward(value, task=task.name, prompt=p.prompt, completion="0")
    assert math.isnan(checked_reward(value, task=task.name, prompt=p.prompt, completion="0", on_invalid="drop"))


def test_a_nan_from_one_function_stays_invalid(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.returns_nan", "exact_match"])
    assert math.isnan(task.reward(task.problems("train")[0], "0"))


def test_builtins():
    assert exact_match(["q", "q"], [" 42\n", "41"], answer=["42", "42"]) == [1.0, 0.0]
    assert exact_match(["q"], [[{"role": "assistant", "content": "7"}]], answer=["7"]) == [1.0]
    assert math_verify(["q", "q"], ["so \\boxed{1/2}", "\\boxed{3}"], answer=["0.5", "2"]) == [1.0, 0.0]
    assert format_reward(["q", "q"], ["x \\boxed{3} y", "3"]) == [1.0, 0.0]
    assert format_reward(["q"], ["<answer>3</answer>"], pattern=r"<answer>\d+</answer>") == [1.0]


def test_format_pattern_option(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=["format"], format_pattern=r"^\d+$",
                       answer_key=None)
    p = task.problems("train")[0]
    assert p.answer == "" and task.reward(p, "12") == 1.0 and task.reward(p, "x") == 0.0


def test_a_raising_reward_function_names_itself_and_the_sample(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.raises"])
    with pytest.raises(RunStopped) as e:
        task.reward(task.problems("train")[2], "oops")
    assert str(e.value) == (f"reward function '{HERE}.raises' raised KeyError: 'solution' for prompt '2+2=' "
                            f"(completion 'oops')")


def test_a_wrong_number_of_values_names_the_function(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.too_many"])
    with pytest.raises(RunStopped, match=f"reward function '{HERE}.too_many' returned 3 values for 1 completions"):
        task.reward(task.problems("train")[0], "0")


# ---------------------------------------------------------------- errors name the key, the file, the column


@pytest.mark.parametrize("kwargs,message", [
    ({"train_path": "nope.jsonl"}, "data.task_kwargs.train_path='nope.jsonl': no such file or directory"),
    ({"test_path": "nope.csv"}, "data.task_kwargs.test_path='nope.csv': no such file or directory"),
    ({"prompt_key": "question"}, "data.task_kwargs.prompt_key='question': {train} has no column 'question'; "
                                 "columns: prompt, answer, level, source"),
    ({"answer_key": "gold"}, "data.task_kwargs.answer_key='gold': {train} has no column 'gold', which the reward "
                             "'math_verify' compares with; columns: prompt, answer, level, source"),
    ({"prompt_key": "level"}, "data.task_kwargs.prompt_key='level': {train} line 1, column 'level': int is not a "
                              "string or a list of chat messages {{role, content}}"),
    ({"reward_fns": ["no_such_module.fn"]}, "data.task_kwargs.reward_fns[0]='no_such_module.fn' cannot be imported "
                                            "(ModuleNotFoundError: No module named 'no_such_module')"),
    ({"reward_fns": [f"{HERE}.nothing"]}, f"data.task_kwargs.reward_fns[0]='{HERE}.nothing' cannot be imported "
                                          f"(module '{HERE}' has no 'nothing')"),
    ({"reward_fns": ["exactmatch"]}, "data.task_kwargs.reward_fns[0]='exactmatch' is invalid (did you mean "
                                     "exact_match?): must be a built-in (exact_match, math_verify, format), judge, a "
                                     "dotted path module.function or a reward model directory"),
    ({"reward_fns": [f"{HERE}.HERE"]}, f"data.task_kwargs.reward_fns[0]='{HERE}.HERE' is not a function"),
    ({"reward_fns": []}, "data.task_kwargs.reward_fns=[] is invalid: must be a non-empty list"),
    ({"reward_fns": "exact_match"}, "data.task_kwargs.reward_fns='exact_match' is invalid: must be a non-empty list"),
    ({"reward_fns": ["exact_match", "format"], "reward_weights": [1.0]},
     "data.task_kwargs.reward_weights has 1 values but data.task_kwargs.reward_fns has 2"),
    ({"reward_weights": ["x"]}, "data.task_kwargs.reward_weights[0]='x' is invalid: must be a finite number"),
    ({"reward_weights": [math.inf]}, "data.task_kwargs.reward_weights[0]=inf is invalid: must be a finite number"),
    ({"format_pattern": "("}, "data.task_kwargs.format_pattern='(' is invalid: not a regular expression"),
    ({"test_fraction": 1.0}, "data.task_kwargs.test_fraction=1.0 is invalid: must be in (0, 1) or null"),
    ({"test_fraction": 0.2, "test_path": "{train}"}, "data.task_kwargs.test_fraction=0.2 is invalid with "
                                                     "data.task_kwargs.test_path"),
    ({"answer_key": None}, "data.task_kwargs.answer_key=None is invalid with the reward 'math_verify'"),
])
def test_errors_name_the_key_the_file_and_the_column(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    train = write(tmp_path / "train.jsonl")
    kwargs = {k: (v.format(train=train) if isinstance(v, str) else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError) as e:
        DatasetTask(**{"train_path": train, **kwargs})
    assert str(e.value).startswith(message.format(train=train)), str(e.value)
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path):
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValueError, match=r"train_path='.*t.txt': unsupported extension '.txt': must be one of "
                                         r"\.jsonl, \.json, \.parquet, \.csv or a saved dataset directory"):
        DatasetTask(train_path=str(tmp_path / "t.txt"))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"train_path='.*bad.jsonl': cannot be read as jsonl"):
        DatasetTask(train_path=str(tmp_path / "bad.jsonl"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match=r"train_path='.*empty_dir': not a saved dataset directory"):
        DatasetTask(train_path=str(tmp_path / "empty_dir"))
    rows = [{"prompt": "a", "answer": [1]}]
    with pytest.raises(ValueError, match=r"answer_key='answer': .*t2.jsonl line 1, column 'answer': list is not"):
        DatasetTask(train_path=write(tmp_path / "t2.jsonl", rows))
    rows = [{"prompt": [{"role": "system", "content": "s"}], "answer": "1"}]
    with pytest.raises(ValueError, match=r"prompt_key='prompt': .*t3.jsonl line 1, column 'prompt': the chat "
                                         r"messages have no 'user' message"):
        DatasetTask(train_path=write(tmp_path / "t3.jsonl", rows))


def test_unknown_task_kwarg_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"data.task_kwargs.test_fractio is not a key of task 'dataset' \(did you "
                                         r"mean data.task_kwargs.test_fraction\?\)"):
        build_task("dataset", train_path=write(tmp_path / "t.jsonl"), test_fractio=0.1)


# ---------------------------------------------------------------- user modules from the working directory


MY_TASK = textwrap.dedent('''
    from lit_ppo.tasks.base import Problem

    class MyTask:
        name = "mine"

        def __init__(self, n=3):
            self.n = n

        def problems(self, split):
            return [Problem(prompt=f"{i}", answer=f"{i}") for i in range(self.n)] if split == "train" else []

        def reward(self, problem, completion):
            return float(completion == problem.answer)

        def allowed_completion_tokens(self, tokenizer):
            return None

    class NotATask:
        name = "no"

    def a_function():
        pass
''')


@pytest.fixture
def user_cwd(tmp_path, monkeypatch):
    """A working directory holding user modules, removed from sys.path and sys.modules afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    name = f"user_mod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MY_TASK)
    (tmp_path / f"{name}_rewards.py").write_text(
        "def one(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    yield name
    for mod in (name, f"{name}_rewards"):
        sys.modules.pop(mod, None)


def test_custom_task_class_by_dotted_path(user_cwd):
    task = build_task(f"{user_cwd}.MyTask", n=4)
    assert task.name == "mine" and len(task.problems("train")) == 4


def test_custom_task_errors(user_cwd):
    with pytest.raises(ValueError, match=f"data.task='{user_cwd}.NotATask' does not implement the Task protocol: "
                                         "it lacks problems, reward, allowed_completion_tokens"):
        build_task(f"{user_cwd}.NotATask")
    with pytest.raises(ValueError, match=f"data.task='{user_cwd}.a_function' is not a class"):
        build_task(f"{user_cwd}.a_function")
    with pytest.raises(ValueError, match=f"data.task='{user_cwd}.Nope' cannot be imported"):
        build_task(f"{user_cwd}.Nope")
    with pytest.raises(ValueError, match=f"data.task_kwargs.m is not a key of task '{user_cwd}.MyTask'"):
        build_task(f"{user_cwd}.MyTask", m=1)


def test_reward_functions_import_from_the_working_directory(user_cwd, tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{user_cwd}_rewards.one"])
    assert task.reward(task.problems("train")[0], "x") == 1.0


def test_ensure_cwd_importable_adds_it_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["/somewhere"])
    ensure_cwd_importable()
    ensure_cwd_importable()
    assert sys.path == ["/somewhere", str(tmp_path)]
    monkeypatch.setattr(sys, "path", [""])
    ensure_cwd_importable()
    assert sys.path == [""]


# ---------------------------------------------------------------- one call per prompt group


class GroupEngine:
    version = 3

    def generate(self, prompts, params):
        from lit_ppo.rollout.engines.protocol import Completion

        return [[Completion(token_ids=[7 + k], logprobs=[-0.5], stopped=True, version=0) for k in range(params.n)]
                for _ in prompts]


class DigitTokenizer:
    pad_token_id, eos_token_id = 0, 1

    def apply_chat_template(self, messages, **kwargs):
        return [5]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids)


def test_workflow_calls_each_reward_function_once_per_group(tmp_path):
    task = DatasetTask(train_path=write(tmp_path / "t.jsonl"), reward_fns=[f"{HERE}.recording"])
    wf = SingleTurnWorkflow(DigitTokenizer(), task, SamplingParams(n=3, max_new_tokens=1), RolloutConfig())
    problems = list(task.problems("train"))[4:6]  # answers "8" and "10"
    batch = wf.run(GroupEngine(), problems)
    assert len(CALLS) == 2
    assert CALLS[0].pop("trainer_state").global_step == 0  # the version that sampled them
    assert CALLS[0] == {"prompts": ["4+4="] * 3, "completions": ["7", "8", "9"], "completion_ids": [[7], [8], [9]],
                        "answer": ["8"] * 3, "level": [1] * 3, "source": ["s4"] * 3}
    assert batch.rewards.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_a_wrong_number_of_group_rewards_stops_the_run():
    class Short:
        name = "short"

        def reward(self, problem, completion):
            return 0.0

        def group_rewards(self, problem, completions):
            return [0.0]

    from lit_ppo.rollout.engines.protocol import Completion
    from lit_ppo.rollout.episodes.episode import group_rewards

    completions = [Completion(token_ids=[2], logprobs=[-0.5], stopped=True, version=0)] * 2
    with pytest.raises(RunStopped, match="task 'short' returned 1 rewards for 2 completions"):
        group_rewards(Short(), Problem(prompt="p", answer=""), completions, ["a", "b"])


# ---------------------------------------------------------------- completion tokens


def test_completion_tokens_are_the_vocabulary_entries_and_the_end(tmp_path):
    from lit_ppo.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    task = DatasetTask(train_path=write(tmp_path / "train.jsonl"), completion_tokens=[0, 1, "7", 1])
    assert task.completion_tokens == ["0", "1", "7", "1"]  # numbers as written
    ids = task.allowed_completion_tokens(tok)
    assert ids == [tok.convert_tokens_to_ids(t) for t in "017"] + [tok.eos_token_id]
    assert tok.decode(ids[:-1]) == "017"
    free = DatasetTask(train_path=write(tmp_path / "train.jsonl"))
    assert free.allowed_completion_tokens(tok) is None


@pytest.mark.parametrize("value", ["0123", [], [True], [1.5], [""], [["a"]]])
def test_completion_tokens_must_be_a_list_of_entries(tmp_path, value):
    with pytest.raises(ValueError, match=r"^data\.task_kwargs\.completion_tokens=.* is invalid: must be a non-empty "
                                         r"list of vocabulary entries \(strings\) or null$"):
        DatasetTask(train_path=write(tmp_path / "train.jsonl"), completion_tokens=value)


def test_a_completion_token_outside_the_vocabulary_is_named(tmp_path):
    from lit_ppo.models import build_tiny_tokenizer

    task = DatasetTask(train_path=write(tmp_path / "train.jsonl"), completion_tokens=["1", "yes"])
    with pytest.raises(ValueError, match="^the tokenizer has no single token for 'yes', which "
                                         "data.task_kwargs.completion_tokens needs$"):
        task.allowed_completion_tokens(build_tiny_tokenizer())

"""The user's data files: every value reaches the reward as written (no type inference), an empty, non-UTF-8
or too long data file is refused in one line naming the key and the file, invalid rewards that empty every
batch are named as such, and a resumed run says when its data file changed."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_ppo.config import GenerationConfig
from lit_ppo.errors import ConfigError, RunStopped
from lit_ppo.launch.compose import compose
from lit_ppo.models import TinyModelConfig, build_tiny_tokenizer
from lit_ppo.rollout.collector import Collector
from lit_ppo.rollout.episodes.choose import build_workflow
from lit_ppo.run.resume import check_resume
from lit_ppo.tasks import ArithmeticTask, CalculatorTask
from lit_ppo.training.checkpoint_files import DIGEST_KEY, scan
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.record import RECORD_KEY
from tests.faults.test_bad_input import error_of
from tests.integration.conftest import run_cli
from tests.unit.fakes import FakeEngineBase
from tests.unit.tasks.test_dataset import DigitTokenizer, GroupEngine

RECORDING_REWARD = textwrap.dedent('''
    def record(prompts, completions, answer, note, **columns):
        """Writes what it receives: the prompt, repr of the answer and of the note column."""
        with open("received.tsv", "a", encoding="utf-8") as f:
            for a, n in zip(answer, note):
                f.write(f"{prompts[0]}\\t{a!r}\\t{n!r}\\n")
        return [0.0] * len(completions)


    def nothing(prompts, completions, **columns):
        """Not applicable to any sample: every reward is invalid."""
        return [None] * len(completions)
''')
TRAIN_CSV = 'prompt,answer,note\n1+1=,007,\n2+2=,0.50,1e3\n'
TEST_JSONL = '{"prompt": "3+3=", "answer": "0", "note": 1.50}\n{"prompt": "4+4=", "answer": 2, "note": null}\n'
AS_WRITTEN = {"1+1=": ("'007'", "''"), "2+2=": ("'0.50'", "'1e3'"), "3+3=": ("'0'", "1.5"), "4+4=": ("2", "None")}
"""What the reward receives per prompt: CSV cells as the strings in the file, JSON values with their JSON types."""
FIT = ["fit", "algo=grpo", "data=dataset", "data.task_kwargs.train_path=train.csv",
       "data.task_kwargs.test_path=test.jsonl", "data.task_kwargs.reward_fns=[user_rewards.record]", "logger=none",
       "trainer.max_steps=1", "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=4",
       "eval.max_problems=4"]
CONTEXT = TinyModelConfig().max_position_embeddings


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> str:
    """One tiny-model cache for the module's runs (the model is built once)."""
    return str(tmp_path_factory.mktemp("model_cache"))


def user_files(cwd: Path) -> Path:
    (cwd / "train.csv").write_text(TRAIN_CSV, encoding="utf-8")
    (cwd / "test.jsonl").write_text(TEST_JSONL, encoding="utf-8")
    (cwd / "user_rewards.py").write_text(RECORDING_REWARD, encoding="utf-8")
    return cwd


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_cache):
    """One iteration of ``data=dataset`` on the CSV and JSONL files, through the real CLI, scored on
    the test split at the end: the working directory and the result."""
    cwd = user_files(tmp_path_factory.mktemp("columns"))
    result = run_cli(FIT, cwd, timeout=300, env={"LIT_PPO_CACHE": model_cache})
    return SimpleNamespace(cwd=cwd, result=result)


@pytest.mark.slow
def test_columns_reach_the_reward_as_written(trained):
    assert trained.result.returncode == 0, trained.result.stderr[-3000:]
    received = {tuple(line.split("\t")) for line in (trained.cwd / "received.tsv").read_text().splitlines()}
    assert received == {(prompt, *values) for prompt, values in AS_WRITTEN.items()}


# ---------------------------------------------------------------- empty and non-UTF-8 files


@pytest.mark.slow
def test_an_empty_file_is_named_in_one_line(tmp_path, model_cache):
    (tmp_path / "train.csv").write_bytes(b"")
    result = run_cli(["fit", "data=dataset", "data.task_kwargs.train_path=train.csv", "logger=none"], tmp_path,
                     timeout=120, env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.task_kwargs.train_path='train.csv': is empty: no rows (0 bytes)")


@pytest.mark.parametrize("name,content,key,detail", [
    ("header.csv", "prompt,answer\n", "train_path", " (a header line only)"),
    ("blank.jsonl", "\n  \n\n", "train_path", " (whitespace only)"),
    ("none.json", "", "train_path", " (0 bytes)"),
    ("list.json", "[]", "train_path", ""),
    ("test.csv", "", "test_path", " (0 bytes)"),
])
def test_every_kind_of_empty_file(capsys, tmp_path, no_model_loading, name, content, key, detail):
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / name).write_text(content)
    paths = {"train_path": str(tmp_path / "train.jsonl"), key: str(tmp_path / name)}
    err = error_of(capsys, "data=dataset", *(f"data.task_kwargs.{k}={v}" for k, v in paths.items()))
    assert err == f"error: data.task_kwargs.{key}={str(tmp_path / name)!r}: is empty: no rows{detail}"


LATIN_1 = 'prompt,answer\n1+1=,2\ncafé,3\n'.encode("latin-1")


@pytest.mark.slow
def test_a_file_that_is_not_utf8_is_named_with_the_place(tmp_path, model_cache):
    (tmp_path / "train.csv").write_bytes(LATIN_1)
    result = run_cli(["fit", "data=dataset", "data.task_kwargs.train_path=train.csv", "logger=none"], tmp_path,
                     timeout=120, env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    offset = LATIN_1.index("é".encode("latin-1"))
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: data.task_kwargs.train_path='train.csv': is not UTF-8 text at line 3 (byte offset {offset}, 0xe9: "
        f"invalid continuation byte): save the file as UTF-8")


def test_non_utf8_json_lines_and_test_path(capsys, tmp_path, no_model_loading):
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    data = '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "\xff"}\n'.encode("latin-1")
    (tmp_path / "test.jsonl").write_bytes(data)
    err = error_of(capsys, "data=dataset", f"data.task_kwargs.train_path={tmp_path / 'train.jsonl'}",
                   f"data.task_kwargs.test_path={tmp_path / 'test.jsonl'}")
    offset = data.index(bytes([0xff]))
    assert err == (f"error: data.task_kwargs.test_path={str(tmp_path / 'test.jsonl')!r}: is not UTF-8 text at line 2 "
                   f"(byte offset {offset}, 0xff: invalid start byte): save the file as UTF-8")


# ---------------------------------------------------------------- invalid rewards that empty every batch


@pytest.mark.slow
def test_dropping_every_group_says_so_and_blames_no_filter(tmp_path, model_cache):
    user_files(tmp_path)
    result = run_cli(["fit", "data=dataset", "data.task_kwargs.train_path=train.csv",
                      "data.task_kwargs.reward_fns=[user_rewards.nothing]", "data.on_invalid_reward=drop",
                      "data.max_attempts_factor=1", "data.batch_size=2", "gconfig.n_samples=2",
                      "gconfig.max_new_tokens=2", "trainer.max_steps=1", "logger=none"], tmp_path, timeout=300,
                     env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: every one of the 2 groups tried was dropped for an invalid reward (data.on_invalid_reward=drop), "
        "0 accepted, fewer than data.batch_size=2 within data.max_attempts_factor=1: rewards must be finite real "
        "numbers"), result.stderr[-3000:]
    assert "dynamic_filter_fn" not in last


def nothing(prompts, completions, **columns):
    return [None] * len(completions)


def half_invalid(prompts, completions, **columns):
    """Invalid for prompt '1+1=', 1.0 for the others."""
    return [None if prompts[0] == "1+1=" else 1.0 for _ in completions]


class AnsweringEngine(GroupEngine, FakeEngineBase):
    """Answers every prompt at once (``GroupEngine``), with the engine methods the collector calls."""


def collector(tmp_path, reward: str, **kwargs) -> Collector:
    """The collector of a datamodule's settings whose engine answers at once, on the rows 1+1=, 2+2=, 3+3=, 4+4=."""
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                                              for i in range(1, 5)))
    data = RolloutDataModule(task="dataset", task_kwargs={"train_path": str(tmp_path / "t.jsonl"),
                                                          "reward_fns": [f"{__name__}.{reward}"]},
                             gconfig=GenerationConfig(n_samples=2, max_new_tokens=1), on_invalid_reward="drop",
                             **{"batch_size": 2, "max_attempts_factor": 2, **kwargs})
    workflow = build_workflow(data.task, DigitTokenizer(), data.sampling_params(DigitTokenizer()), data.rollout,
                              max_model_len=64)
    return Collector(AnsweringEngine(), workflow, data.stream, data.rollout, data.accept)


def test_dynamic_batches_emptied_by_invalid_rewards(tmp_path):
    rollouts = collector(tmp_path, "nothing", dynamic_bs=True)
    assert rollouts.collect().num_groups == 0  # the first empty batch is skipped
    with pytest.raises(RunStopped) as stopped:
        rollouts.collect()
    assert str(stopped.value).startswith(
        "every one of the 4 groups tried in 2 consecutive iterations (data.max_attempts_factor=2) was dropped for "
        "an invalid reward (data.on_invalid_reward=drop): rewards must be finite real numbers")


def test_a_filter_is_not_blamed_for_invalid_rewards(tmp_path):
    rollouts = collector(tmp_path, "nothing", dynamic_filter_fn="lit_ppo.rollout.filters.mixed_outcomes")
    with pytest.raises(RunStopped, match=r"^every one of the 4 groups tried was dropped for an invalid reward"):
        rollouts.collect()
    # Without a filter, some groups valid, too few: the invalid ones are counted, no filter named.
    rollouts = collector(tmp_path, "half_invalid", max_attempts_factor=1, batch_size=4)
    with pytest.raises(RunStopped) as stopped:
        rollouts.collect()
    assert str(stopped.value).startswith("1 of the 4 groups tried were dropped for an invalid reward "
                                         "(data.on_invalid_reward=drop), 3 accepted, fewer than data.batch_size=4")
    assert "dynamic_filter_fn" not in str(stopped.value)


# ---------------------------------------------------------------- prompt + completion within the model's context


def prompt_tokens(tokenizer, prompt: str) -> int:
    return len(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False))


def setup_error(data: RolloutDataModule, stage: str = "fit") -> str | None:
    """The error of ``data.setup`` with the tiny model's tokenizer and context, None if it passes."""
    config = SimpleNamespace(max_position_embeddings=CONTEXT)
    data.trainer = SimpleNamespace(lightning_module=SimpleNamespace(tokenizer=build_tiny_tokenizer(),
                                                                    policy=SimpleNamespace(config=config)))
    try:
        data.setup(stage)
    except ConfigError as e:
        assert "\n" not in str(e)
        return str(e)
    return None


@pytest.mark.slow
def test_a_completion_budget_beyond_the_context_is_refused_before_training(tmp_path, model_cache):
    tokenizer = build_tiny_tokenizer()
    task = ArithmeticTask(seed=0)
    longest = max(prompt_tokens(tokenizer, p.prompt) for split in ("train", "test") for p in task.problems(split))
    result = run_cli(["fit", "gconfig.max_new_tokens=200", "logger=none", "trainer.max_steps=1"], tmp_path,
                     timeout=300, env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: gconfig.max_new_tokens=200 and the longest prompt ({longest} tokens, "), last
    assert last.endswith(f"need {longest + 200} positions, more than the model's context length of {CONTEXT} "
                         f"(max_position_embeddings in its config): lower gconfig.max_new_tokens to "
                         f"{CONTEXT - longest} or less, or shorten the prompts"), last
    assert "iteration 1" not in result.stdout


def test_a_prompt_longer_than_the_context(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "9" * 200, "answer": "9"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = RolloutDataModule(task="dataset", task_kwargs={"train_path": str(tmp_path / "t.jsonl")},
                             gconfig=GenerationConfig(max_new_tokens=4))
    error = setup_error(data)
    assert error.startswith(f"gconfig.max_new_tokens=4 and the longest prompt "
                            f"({prompt_tokens(build_tiny_tokenizer(), '9' * 200)} tokens, train problem 1) need")
    assert error.endswith("the prompt alone does not fit: shorten the prompts (and data.system_prompt) or use a model "
                          "with a longer context")


def test_multi_turn_episodes_must_fit_the_context():
    tokenizer = build_tiny_tokenizer()
    task = CalculatorTask(seed=0, num_train=50, num_test=5)
    longest = max(prompt_tokens(tokenizer, p.prompt) for split in ("train", "test") for p in task.problems(split))
    markup = len(tokenizer.encode("<|user|><|assistant|>", add_special_tokens=False))  # an empty feedback turn
    data = RolloutDataModule(task="calculator", task_kwargs={"seed": 0, "num_train": 50, "num_test": 5},
                             gconfig=GenerationConfig(max_new_tokens=16), max_turns=60)
    error = setup_error(data)
    need = longest + 60 * 16 + 59 * markup
    assert error.startswith(f"data.max_turns=60 turns of gconfig.max_new_tokens=16 after the longest first prompt "
                            f"({longest} tokens, "), error
    assert error.endswith(f"with 59 feedback turn(s) of at least {markup} tokens between them, need at least {need} "
                          f"positions, more than the model's context length of {CONTEXT} (max_position_embeddings in "
                          f"its config): lower data.max_turns to {(CONTEXT - longest + markup) // (16 + markup)} or "
                          f"less, or gconfig.max_new_tokens"), error


@pytest.mark.parametrize("overrides", [[], ["data=calculator"], ["data=calculator", "data.max_turns=5"]])
def test_the_presets_fit_the_tiny_models_context(overrides):
    data = compose(overrides)["data"]
    data["gconfig"] = GenerationConfig(**data["gconfig"])
    assert setup_error(RolloutDataModule(**data)) is None
    assert setup_error(RolloutDataModule(**data), stage="validate") is None


# ---------------------------------------------------------------- a changed data file on resume


def _last_checkpoint(cwd: Path) -> Path:
    (path,) = cwd.glob("runs/**/last.ckpt")
    return path


@pytest.mark.slow
def test_resuming_on_a_changed_data_file_says_so(trained, tmp_path, model_cache):
    assert trained.result.returncode == 0, trained.result.stderr[-3000:]
    checkpoint = _last_checkpoint(trained.cwd)
    for name in ("train.csv", "test.jsonl", "user_rewards.py"):
        shutil.copy(trained.cwd / name, tmp_path / name)
    (tmp_path / "train.csv").write_text(TRAIN_CSV.replace("0.50", "0.5"), encoding="utf-8")  # a fixed row
    result = run_cli([*FIT, "--ckpt_path", str(checkpoint), "--print_config"], tmp_path, timeout=120,
                     env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [f"note: --ckpt_path {checkpoint}: data.task_kwargs.train_path=train.csv changed since the "
                     f"checkpoint was written (its SHA-256 differs): the resumed run trains on the changed data"]


@pytest.mark.slow
def test_no_note_for_the_same_data_or_a_checkpoint_without_digests(trained, tmp_path, monkeypatch, capfd):
    assert trained.result.returncode == 0, trained.result.stderr[-3000:]
    monkeypatch.chdir(trained.cwd)
    tree = compose(FIT[1:])
    checkpoint = _last_checkpoint(trained.cwd)
    check_resume(str(checkpoint), tree)
    content = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert {k for k in content[RECORD_KEY] if k.endswith(".sha256")} == {"task.train_path.sha256",
                                                                         "task.test_path.sha256"}
    # A checkpoint written before records held digests, and data changed since: nothing to compare.
    content[RECORD_KEY] = {k: v for k, v in content[RECORD_KEY].items() if not k.endswith(".sha256")}
    content[DIGEST_KEY] = scan(content).digest
    old = tmp_path / "old.ckpt"
    torch.save(content, old)
    monkeypatch.chdir(tmp_path)
    user_files(tmp_path)
    (tmp_path / "train.csv").write_text(TRAIN_CSV + "5+5=,10,\n", encoding="utf-8")
    check_resume(str(old), tree)
    assert capfd.readouterr().err == ""

"""A prompt and its completion budget longer than the model's context are refused before the run directory
exists: one line naming the keys and the limit, exit code 2, no model loaded, nothing written. The context is
read from the model's config without its weights: the tiny model's, or a model directory's config.json."""

from __future__ import annotations

import json

import pytest

from lit_ppo.__main__ import main
from lit_ppo.models import TinyModelConfig, build_tiny, write_hf_files

pytestmark = pytest.mark.usefixtures("no_model_loading")
PROMPTS = ["1+2=", "3+4=", "12345+678=", "5+6="]
"""The longest is row 2: 10 characters."""


def write_rows(path, prompts) -> None:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts))


def refusal(capsys, *args: str) -> str:
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    return line


def test_the_tiny_models_context_is_checked_before_the_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    write_rows(tmp_path / "train.jsonl", PROMPTS)
    # data=dataset's gconfig.max_new_tokens=256, on the tiny model's 128 positions. Its chat template puts one
    # token before the prompt and one after it (<|user|>, <|assistant|>), and its tokens are characters.
    longest = 1 + len("12345+678=") + 1
    assert refusal(capsys, "fit", "logger=none", "data=dataset", "data.task_kwargs.train_path=train.jsonl") == (
        f"error: gconfig.max_new_tokens=256 and the longest prompt ({longest} tokens, train problem 2) need "
        f"{longest + 256} positions, more than the model's context length of 128 (max_position_embeddings in its "
        f"config): lower gconfig.max_new_tokens to {128 - longest} or less, or shorten the prompts")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]  # no run directory, no model built
    # What fits passes every check: the run goes on to its directory.
    from lit_ppo.launch.check import check_config
    from lit_ppo.launch.compose import compose

    check_config(compose(["logger=none", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                          f"gconfig.max_new_tokens={128 - longest}"]))


def test_a_model_directorys_context_comes_from_its_config_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", str(tmp_path / "cache"))
    model, tokenizer = build_tiny(TinyModelConfig(), tmp_path / "built")
    write_hf_files(model, tokenizer, tmp_path / "short")
    config = json.loads((tmp_path / "short" / "config.json").read_text())
    (tmp_path / "short" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40}))
    write_rows(tmp_path / "train.jsonl", PROMPTS[:2])
    write_rows(tmp_path / "test.jsonl", PROMPTS)
    # validate scores the test split only: its prompts count.
    longest = 1 + len("12345+678=") + 1
    assert refusal(capsys, "validate", f"model={tmp_path / 'short'}", "data=dataset", "gconfig.max_new_tokens=30",
                   "data.task_kwargs.train_path=train.jsonl", "data.task_kwargs.test_path=test.jsonl") == (
        f"error: gconfig.max_new_tokens=30 and the longest prompt ({longest} tokens, test problem 2) need "
        f"{longest + 30} positions, more than the model's context length of 40 (max_position_embeddings in its "
        f"config): lower gconfig.max_new_tokens to {40 - longest} or less, or shorten the prompts")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()

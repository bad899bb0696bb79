"""Training a user's own model: ``model=DIR`` for any local causal LM directory, a plain prompt format
for a tokenizer without a chat template, and one-line errors (before any model loads) for a value that
is neither a model option nor a loadable directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_ppo.models import PLAIN_CHAT_TEMPLATE, TINY_CHAT_TEMPLATE, build_tiny, use_chat_template, write_hf_files
from tests.faults.test_bad_input import error_of
from tests.integration.conftest import run_cli, run_dir


def _tiny_dir(root: Path) -> Path:
    """A local model directory: the tiny model, its tokenizer stripped of the chat template."""
    model, tokenizer = build_tiny(cache_dir=root / "cache")
    tokenizer.chat_template = None
    write_hf_files(model, tokenizer, root / "my-model")
    return root / "my-model"


@pytest.mark.slow
def test_fit_on_a_local_model_dir_without_chat_template(tmp_path):
    model_dir = _tiny_dir(tmp_path)
    assert not (model_dir / "chat_template.jinja").exists()
    result = run_cli(["fit", f"model={model_dir}", "trainer.max_steps=1", "data.batch_size=2",
                      "gconfig.n_samples=2", "logger=none"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    config = (run_dir(tmp_path) / "config.yaml").read_text()
    assert str(model_dir.absolute()) in config
    # The model trained with the plain prompt format, and its export carries it.
    assert (run_dir(tmp_path) / "model" / "chat_template.jinja").read_text() == PLAIN_CHAT_TEMPLATE


def test_model_dir_is_model_source(tmp_path, monkeypatch):
    from lit_ppo.launch.compose import compose

    model_dir = _tiny_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    by_group = compose(["model=./my-model", "logger=none"])
    by_source = compose([f"model.source={model_dir}", "logger=none"])
    assert by_group["model"]["model"]["source"] == str(model_dir.absolute())
    assert by_group == by_source


@pytest.mark.parametrize("value,expected", [
    ("nope", "model=nope is invalid: must be one of smollm2, tiny or a local model directory"),
    ("./no/such/dir", "model=./no/such/dir is not a directory"),
])
def test_model_values_that_are_neither_option_nor_directory(capsys, tmp_path, monkeypatch, no_model_loading,
                                                            value, expected):
    monkeypatch.chdir(tmp_path)
    assert error_of(capsys, f"model={value}", "logger=none") == f"error: {expected}"


def test_directories_that_are_not_causal_lms(capsys, tmp_path, no_model_loading):
    from transformers import BertConfig

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json: must be a Hugging Face model directory" in error_of(capsys, f"model={empty}")
    no_tokenizer = tmp_path / "no-tokenizer"
    BertConfig(architectures=["BertForCausalLM"]).save_pretrained(no_tokenizer)
    assert "has no tokenizer" in error_of(capsys, f"model={no_tokenizer}")
    masked = tmp_path / "masked-lm"
    BertConfig(architectures=["BertForMaskedLM"]).save_pretrained(masked)
    (masked / "tokenizer.json").write_text("{}")
    assert (f"model={masked} is not a causal LM (model_type 'bert', architectures BertForMaskedLM)"
            in error_of(capsys, f"model={masked}"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (broken / "tokenizer.json").write_text("{}")
    assert "has a config.json transformers cannot read" in error_of(capsys, f"model={broken}")
    assert "model.source=/no/such/dir is not a directory" in error_of(capsys, "model.source=/no/such/dir")


def test_plain_prompt_format_without_chat_template():
    from lit_ppo.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    assert use_chat_template(tokenizer).chat_template == TINY_CHAT_TEMPLATE  # its own template is kept
    tokenizer.chat_template = None
    use_chat_template(tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "Be brief.\n\nUser: 1+1?\nAssistant: 2<|end|>\nUser: 2+2?\nAssistant:"
    assert use_chat_template(tokenizer, "{{ messages[0]['content'] }}").chat_template == "{{ messages[0]['content'] }}"


def test_plain_prompt_format_has_turns_for_multi_turn_tasks():
    from lit_ppo.config import RolloutConfig
    from lit_ppo.models import build_tiny_tokenizer
    from lit_ppo.rollout.engines.protocol import SamplingParams
    from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow

    class Conversation:
        name = "conversation"

        def environment(self, problem):
            raise NotImplementedError

        def reward(self, problem, completion):
            return 0.0

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    use_chat_template(tokenizer)
    workflow = MultiTurnWorkflow(tokenizer, Conversation(), SamplingParams(), RolloutConfig(max_turns=2))
    assert (workflow._assistant_close, workflow._feedback_open, workflow._feedback_close) == (
        "<|end|>\n", "User: ", "\nAssistant:")

"""A teacher for on-policy distillation (lit_ppo.models.teacher): it must be a causal LM directory with the
policy's vocabulary, checked from its files before any model loads, and loads frozen."""

from __future__ import annotations

import json

import pytest
import torch

from lit_ppo.models import TinyModelConfig, build_tiny, build_tiny_tokenizer, load_teacher, teacher_tokenizer_problem


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    model, tokenizer = build_tiny(TinyModelConfig(seed=1), path / "cache")
    model.save_pretrained(path / "model")
    tokenizer.save_pretrained(path / "model")
    return path / "model"


def test_a_teacher_with_the_policys_vocabulary_loads_frozen(teacher_dir):
    assert teacher_tokenizer_problem(str(teacher_dir), "tiny") is None
    teacher = load_teacher(str(teacher_dir), build_tiny_tokenizer(), torch.float32)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_another_vocabulary_is_refused_from_the_files(teacher_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for f in teacher_dir.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = "1", "2"
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two digits swapped: the same size, other ids
    (other / "tokenizer.json").write_text(json.dumps(data))
    problem = teacher_tokenizer_problem(str(other), "tiny")
    assert problem.startswith("has another tokenizer than the policy (")
    assert problem.endswith("the teacher scores the policy's token ids, so it must share its vocabulary")
    with pytest.raises(ValueError, match=r"^model.teacher=.* has another tokenizer than the policy"):
        load_teacher(str(other), build_tiny_tokenizer(), torch.float32)


def test_a_directory_without_a_config_is_refused_from_its_listing(tmp_path):
    assert (teacher_tokenizer_problem(str(tmp_path), "tiny")
            == "has no config.json: must be a Hugging Face model directory")


def test_a_teacher_with_the_vocabulary_that_is_not_a_causal_lm_is_refused_by_the_check(teacher_dir, tmp_path):
    from lit_ppo.errors import ConfigError
    from lit_ppo.launch.check import check_values
    from lit_ppo.launch.compose import compose

    masked = tmp_path / "masked"
    masked.mkdir()
    for f in teacher_dir.iterdir():
        (masked / f.name).write_bytes(f.read_bytes())
    (masked / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    assert teacher_tokenizer_problem(str(masked), "tiny") is None  # its files and vocabulary are the policy's
    with pytest.raises(ConfigError) as refused:
        check_values(compose(["algo=opd", f"model.teacher={masked}"]))
    assert str(refused.value) == (f"model.teacher={masked} is not a causal LM (model_type 'bert', architectures "
                                  f"BertForMaskedLM)")

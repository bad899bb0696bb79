"""``lit_ppo.config.model``: the model section, and the base model that a model directory lit_ppo wrote records."""

from __future__ import annotations

import json

import pytest

from lit_ppo.config.model import MODEL_RECORD, base_model


def test_a_directory_lit_ppo_wrote_has_the_base_model_it_records(tmp_path):
    (tmp_path / MODEL_RECORD).write_text(json.dumps({"base_model": "tiny"}))
    assert base_model(str(tmp_path)) == "tiny"
    assert base_model(f"{tmp_path}/") == "tiny"


@pytest.mark.parametrize("record", [None, "{not json", '["tiny"]', '{"base_model": ""}', '{"base_model": 3}'])
def test_any_other_source_is_its_own_base_model(tmp_path, record, monkeypatch):
    if record is not None:
        (tmp_path / MODEL_RECORD).write_text(record)
    assert base_model(str(tmp_path)) == str(tmp_path)
    assert base_model("org/name") == "org/name" and base_model(None) is None
    # A named source is never read as a directory, even where the working directory holds one of that name.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / MODEL_RECORD).write_text(json.dumps({"base_model": "tiny"}))
    assert base_model("smollm2") == "smollm2"

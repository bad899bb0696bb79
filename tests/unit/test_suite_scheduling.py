"""``make test`` runs the suite on two pytest-xdist workers: a session fixture that several files
share must be built on one of them only, so those files are scheduled together."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import SHARED_SESSION_FIXTURES, run_order, work_unit

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


@pytest.mark.parametrize("fixture", sorted(SHARED_SESSION_FIXTURES))
def test_every_file_that_uses_a_shared_session_fixture_is_in_its_group(fixture):
    users = {path.relative_to(REPO).as_posix() for path in TESTS.rglob("test_*.py")
             if re.search(rf"\b{fixture}\b", path.read_text()) and path.name != Path(__file__).name}
    assert users == set(SHARED_SESSION_FIXTURES[fixture])


def test_a_work_unit_is_a_file_or_a_shared_fixtures_group():
    assert work_unit("tests/integration/test_export.py::test_a[x::y]") == "demo_run"
    assert work_unit("tests/integration/test_sync_path_unchanged.py::test_b") == "demo_run"
    assert work_unit("tests/unit/rollout/engines/test_vllm.py::test_c") == "smollm2_cache"
    assert work_unit("tests/integration/test_smollm2.py::test_d") == "smollm2_cache"
    assert work_unit("tests/unit/algos/test_gae.py::test_e[1]") == work_unit("tests/unit/algos/test_gae.py::test_f")
    assert work_unit("tests/unit/algos/test_gae.py::test_e") == "tests/unit/algos/test_gae.py"


def test_units_outside_the_unit_tests_start_first_most_tests_first():
    units = {"tests/unit/a.py": ["tests/unit/a.py::t"] * 5, "tests/faults/b.py": ["tests/faults/b.py::t"],
             "smollm2_cache": ["tests/unit/rollout/engines/test_vllm.py::t", "tests/integration/test_smollm2.py::t"],
             "tests/unit/c.py": ["tests/unit/c.py::t"] * 9, "tests/integration/d.py": ["tests/integration/d.py::t"] * 3}
    assert run_order(units) == ["tests/integration/d.py", "smollm2_cache", "tests/faults/b.py", "tests/unit/c.py",
                                "tests/unit/a.py"]


@pytest.mark.slow
def test_two_workers_run_each_group_on_one_worker(tmp_path):
    """A real ``pytest -n 2`` over a tree with the grouped files' paths (each test records its worker, when
    it ran and its OMP_NUM_THREADS) and as many ungrouped files: every group's tests land on one worker, a
    file's tests too, a file of one integration test runs before the unit tests' files of three, and each
    worker has half of the cores as torch threads."""
    grouped = [path for paths in SHARED_SESSION_FIXTURES.values() for path in paths]
    others = [f"tests/unit/test_other_{i}.py" for i in range(len(grouped))]
    single = "tests/integration/test_single.py"
    record = tmp_path / "workers"
    record.mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom tests.conftest import pytest_xdist_make_scheduler\n")
    body = ("import os, time\n\n\ndef test_{i}():\n    time.sleep(0.2)\n"
            "    open(os.path.join({record!r}, {name!r} + '-{i}'), 'w').write(\n"
            "        os.environ['PYTEST_XDIST_WORKER'] + ' ' + str(time.monotonic_ns()) + ' '\n"
            "        + os.environ.get('OMP_NUM_THREADS', 'unset'))\n")
    for path in grouped + others + [single]:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("\n\n".join(body.format(i=i, record=str(record), name=path.replace("/", "."))
                                    for i in range(1 if path == single else 3)))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
                                 "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    recorded = {f.name: f.read_text().split() for f in record.iterdir()}
    assert len(recorded) == 3 * len(grouped + others) + 1
    worker = {name: w for name, (w, _, _) in recorded.items()}
    assert {threads for _, _, threads in recorded.values()} == {str(max(1, len(os.sched_getaffinity(0)) // 2))}

    def workers_of(paths):
        return {w for name, w in worker.items() if name.rsplit("-", 1)[0] in {p.replace("/", ".") for p in paths}}

    def first_done(path):
        return min(int(t) for name, (_, t, _) in recorded.items() if name.rsplit("-", 1)[0] == path.replace("/", "."))

    assert first_done(single) < max(first_done(path) for path in others)
    for paths in SHARED_SESSION_FIXTURES.values():
        assert len(workers_of(paths)) == 1, paths
    for path in others:
        assert len(workers_of([path])) == 1, path
    assert set(worker.values()) == {"gw0", "gw1"}  # both workers had work

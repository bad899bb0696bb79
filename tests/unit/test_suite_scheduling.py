"""``make test`` runs the suite on two pytest-xdist workers: a session fixture that several files
share must be built on one of them only, so those files are scheduled together."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import SHARED_SESSION_FIXTURES, work_unit

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


@pytest.mark.slow
def test_two_workers_run_each_group_on_one_worker(tmp_path):
    """A real ``pytest -n 2`` over a tree with the grouped files' paths (each test records its worker)
    and as many ungrouped files: every group's tests land on one worker, a file's tests too."""
    grouped = [path for paths in SHARED_SESSION_FIXTURES.values() for path in paths]
    others = [f"tests/unit/test_other_{i}.py" for i in range(len(grouped))]
    record = tmp_path / "workers"
    record.mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom tests.conftest import pytest_xdist_make_scheduler\n")
    body = ("import os, time\n\n\ndef test_{i}():\n    time.sleep(0.2)\n"
            "    open(os.path.join({record!r}, {name!r} + '-{i}'), 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n")
    for path in grouped + others:
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("\n\n".join(body.format(i=i, record=str(record), name=path.replace("/", "."))
                                    for i in range(3)))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker = {f.name: f.read_text() for f in record.iterdir()}
    assert len(worker) == 3 * len(grouped + others)

    def workers_of(paths):
        return {w for name, w in worker.items() if name.rsplit("-", 1)[0] in {p.replace("/", ".") for p in paths}}

    for paths in SHARED_SESSION_FIXTURES.values():
        assert len(workers_of(paths)) == 1, paths
    for path in others:
        assert len(workers_of([path])) == 1, path
    assert set(worker.values()) == {"gw0", "gw1"}  # both workers had work

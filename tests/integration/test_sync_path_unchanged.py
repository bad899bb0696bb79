"""The default run's metrics, step by step, against a recording (tests/fixtures/default_run_metrics.json),
on the shared demo run (tests/integration/conftest.py): any change to the default run's numbers shows.

A change meant to alter them (e.g. a faster kernel that rounds differently) records the fixture anew,
``LIT_PPO_RECORD_DEFAULT_RUN=1 pytest tests/integration/test_sync_path_unchanged.py``, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "default_run_metrics.json"
TIMING = ("time/", "perf/")  # wall-clock, differ from run to run


def this_machine() -> dict:
    """What float32 results depend on besides the code: the CPU, its vector instructions, torch, and the
    threads of a fresh process like the demo run's (this process's count may have been set by a test)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True).stdout
    return {"cpu": model, "isa": sorted(f for f in set(flags) if f.startswith(("avx", "amx", "fma", "sse4"))),
            "torch": torch.__version__, "threads": int(threads)}


def logged_metrics(demo_run) -> dict[str, list[tuple[int, float]]]:
    """Every non-timing metric of the demo run's MLflow run: (step, value) pairs in step order."""
    client = MlflowClient(demo_run.env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
    # Sorted by value within a step too: Lightning logs `epoch` twice at an evaluation's step.
    return {key: sorted(((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)))
            for key in sorted(run.data.metrics) if not key.startswith(TIMING)}


def test_default_run_metrics_are_bit_identical_to_the_recording(demo_run):
    """The default run (synchronous, rollout.max_head_offpolicyness=0) must stay exactly as recorded.
    Bit for bit only on the kind of machine that recorded it: other kernels round differently."""
    machine = this_machine()
    if os.environ.get("LIT_PPO_RECORD_DEFAULT_RUN") == "1":
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        source = (f"python -m lit_ppo fit algo=grpo (the demo run) on the tree of commit {head} and its changes; "
                  f"every MLflow metric except time/* and perf/*, as [step, value] pairs in step order")
        FIXTURE.write_text(json.dumps({"source": source, "recorded_on": machine,
                                       "metrics": logged_metrics(demo_run)}, indent=1) + "\n")
        pytest.skip(f"recorded {FIXTURE}")
    fixture = json.loads(FIXTURE.read_text())
    if machine != fixture["recorded_on"]:
        pytest.skip(f"recorded on {fixture['recorded_on']}, this is {machine}")
    expected = {key: [(step, value) for step, value in pairs] for key, pairs in fixture["metrics"].items()}
    logged = logged_metrics(demo_run)
    for key in sorted(expected.keys() & logged.keys()):
        want, got = expected[key], logged[key]
        if [s for s, _ in got] != [s for s, _ in want]:
            raise AssertionError(f"{key}: logged at steps {[s for s, _ in got]}, the fixture has {[s for s, _ in want]}")
        for (step, value), (_, value_then) in zip(got, want):
            assert value == value_then, f"{key} at step {step}: {value!r} now, {value_then!r} in {FIXTURE.name}"
    assert logged.keys() == expected.keys(), (
        f"metrics only in this run: {sorted(logged.keys() - expected.keys())}; only in {FIXTURE.name}: "
        f"{sorted(expected.keys() - logged.keys())} (a metric of the synchronous path was added or dropped)")

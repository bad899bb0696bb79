"""The default run's metrics, step by step, against recordings (tests/fixtures/default_run_metrics.json),
on the shared demo run (tests/integration/conftest.py): any change to the default run's numbers shows.

On a kind of machine with a recording, every metric at every step must be bit-identical; on any
machine, the first iterations must match every recording to rounding. A change meant to alter the
numbers (e.g. a faster kernel that rounds differently) records the fixture anew on each kind of
machine, ``LIT_PPO_RECORD_DEFAULT_RUN=1 pytest tests/integration/test_sync_path_unchanged.py``, and
says so."""

from __future__ import annotations

import json
import math
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


def this_machine(demo_run) -> dict:
    """What float32 results depend on besides the code: the CPU, its vector instructions, torch, and the
    threads of a fresh process in the demo run's environment (this process's count may have been set by a
    test, or by the test session for its workers)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    env = {key: value for key, value in {**os.environ, **demo_run.env}.items() if value is not None}
    threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True, env=env).stdout
    return {"cpu": model, "isa": sorted(f for f in set(flags) if f.startswith(("avx", "amx", "fma", "sse4"))),
            "torch": torch.__version__, "threads": int(threads)}


def logged_metrics(demo_run) -> dict[str, list[tuple[int, float]]]:
    """Every non-timing metric of the demo run's MLflow run: (step, value) pairs in step order."""
    client = MlflowClient(demo_run.env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("lit_ppo").experiment_id])
    return {key: sorted(((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)))
            for key in sorted(run.data.metrics) if not key.startswith(TIMING)}


def recordings() -> list[dict]:
    return json.loads(FIXTURE.read_text())["recordings"]


def record(demo_run, machine: dict) -> None:
    """Add this machine's recording to the fixture (replacing an older one of the same machine)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    kept = [r for r in recordings() if r["recorded_on"] != machine] if FIXTURE.exists() else []
    source = ("python -m lit_ppo fit algo=grpo (the demo run); every MLflow metric except time/* and perf/*, "
              "as [step, value] pairs in step order; one recording per kind of machine")
    kept.append({"commit": head, "recorded_on": machine, "metrics": logged_metrics(demo_run)})
    FIXTURE.write_text(json.dumps({"source": source, "recordings": kept}, indent=1) + "\n")


def compare(logged: dict, recorded: dict, close, iterations: int | None = None) -> None:
    """Every metric at every step (or at the first ``iterations`` steps) as ``close(value, recorded)``."""
    assert logged.keys() == recorded.keys(), (
        f"metrics only in this run: {sorted(logged.keys() - recorded.keys())}; only in {FIXTURE.name}: "
        f"{sorted(recorded.keys() - logged.keys())} (a metric of the synchronous path was added or dropped)")
    for key in sorted(recorded):
        want = [(step, value) for step, value in recorded[key] if iterations is None or step <= iterations]
        got = [(step, value) for step, value in logged[key] if iterations is None or step <= iterations]
        if [s for s, _ in got] != [s for s, _ in want]:
            raise AssertionError(f"{key}: logged at steps {[s for s, _ in got]}, "
                                 f"the fixture has {[s for s, _ in want]}")
        for (step, value), (_, value_then) in zip(got, want):
            assert close(value, value_then), f"{key} at step {step}: {value!r} now, {value_then!r} in {FIXTURE.name}"


def test_default_run_metrics_are_bit_identical_to_the_recording(demo_run):
    """The default run (synchronous, rollout.max_head_offpolicyness=0) must stay exactly as recorded on
    this kind of machine. Bit for bit only there: other kernels round differently."""
    machine = this_machine(demo_run)
    if os.environ.get("LIT_PPO_RECORD_DEFAULT_RUN") == "1":
        record(demo_run, machine)
        pytest.skip(f"recorded this machine's run in {FIXTURE}")
    mine = [r for r in recordings() if r["recorded_on"] == machine]
    if not mine:
        pytest.skip(f"no recording of this machine ({machine}) to compare bit for bit: "
                    f"test_default_run_metrics_match_every_recording_at_a_tolerance checks the run here; "
                    f"LIT_PPO_RECORD_DEFAULT_RUN=1 pytest {Path(__file__).name} records one")
    compare(logged_metrics(demo_run), mine[0]["metrics"], lambda a, b: a == b)


AGREEING_ITERATIONS = 10
"""Iterations over which runs on different kernels sample the same tokens, so that their metrics differ
by rounding only. Measured: an AMD EPYC with AVX-512 and one with AVX2 only agree within 1e-4 for 21
iterations (a sampled token flips at the 22nd); half of that leaves room for other CPUs."""


def test_default_run_metrics_match_every_recording_at_a_tolerance(demo_run):
    """On any machine: the default run's first iterations match every recording (other CPUs' included)
    to rounding. A changed loss, advantage, sampler or metric moves them by far more than 1e-4."""
    logged = logged_metrics(demo_run)
    for recording in recordings():
        compare(logged, recording["metrics"], lambda a, b: math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6),
                AGREEING_ITERATIONS)

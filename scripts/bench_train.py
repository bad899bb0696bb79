"""Training benchmark: seconds per RL iteration and peak memory, default run vs model=smollm2.

    python scripts/bench_train.py                 # quick (make bench): the default run only
    python scripts/bench_train.py --full          # docs/benchmarks.md numbers: + model=smollm2, float32 and bf16-mixed
    python scripts/bench_train.py [--steps 5] [--only tiny|smollm2]

Each configuration runs in its own subprocess through the real CLI (so peak RSS is its own), one
after the other in this run; the table reports both and their ratio. The first iteration is
excluded from the time per iteration (it includes engine creation and warm-up).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    "tiny (default grpo, arithmetic)": ["algo=grpo"],
    "smollm2 (grpo, gsm_symbolic)": ["algo=grpo", "model=smollm2", "data=gsm_symbolic", "data.batch_size=2",
                                     "gconfig.n_samples=4", "gconfig.max_new_tokens=64"],
    "smollm2 bf16-mixed (the same)": ["algo=grpo", "model=smollm2", "data=gsm_symbolic", "data.batch_size=2",
                                      "gconfig.n_samples=4", "gconfig.max_new_tokens=64",
                                      "trainer.precision=bf16-mixed"],
}

CHILD = r"""
import json, resource, sys, time
import lightning as L
from lit_ppo.__main__ import main

times = []
class Timer(L.Callback):
    def on_train_batch_start(self, *a):
        self.t = time.perf_counter()
    def on_train_batch_end(self, *a):
        times.append(time.perf_counter() - self.t)

import lit_ppo.training.module as m
original = m.LitPPO.configure_callbacks
m.LitPPO.configure_callbacks = lambda self: original(self) + [Timer()]
code = main(["fit", *sys.argv[1:]])
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH " + json.dumps({"code": code, "times": times, "peak_mb": peak_mb}))
"""


def run(overrides: list[str], steps: int) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        args = [*overrides, "logger=none", f"trainer.max_steps={steps}", "trainer.callbacks=[]"]
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - start
    line = [output for output in proc.stdout.splitlines() if output.startswith("BENCH ")]
    if proc.returncode or not line:
        raise RuntimeError(f"{overrides} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(line[0][6:])
    result["wall"] = wall
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="also model=smollm2 (default: the tiny default run)")
    parser.add_argument("--only", choices=["tiny", "smollm2"])
    args = parser.parse_args()
    only = args.only or (None if args.full else "tiny")
    rows = []
    for name, overrides in CONFIGS.items():
        if only and not name.startswith(only):
            continue
        r = run(overrides, args.steps)
        steady = r["times"][1:] or r["times"]
        rows.append((name, sum(steady) / len(steady), r["peak_mb"], r["wall"]))
    base_s, base_mb = rows[0][1], rows[0][2]
    print(f"{'configuration':<34} {'s/iter':>8} {'x':>7} {'peak RSS MB':>12} {'x':>6} {'wall s':>8}")
    for name, s, mb, wall in rows:
        print(f"{name:<34} {s:8.2f} {s / base_s:6.1f}x {mb:12.0f} {mb / base_mb:5.1f}x {wall:8.0f}")


if __name__ == "__main__":
    main()

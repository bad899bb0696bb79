"""Proximal log-probs benchmark: seconds per iteration of the decoupled loss with pi_prox recomputed by a
forward pass (actor.prox_logp_method=recompute) against its approximations (loglinear, linear), the same
run otherwise: algo=icepop under asynchronous rollouts one version ahead (rollout.max_head_offpolicyness=1),
where tokens are stale and the approximation is what it is for.

    python scripts/bench_prox.py           # quick: tiny, 12 iterations x 1 run per method (~1 min idle)
    python scripts/bench_prox.py --full    # docs/benchmarks.md numbers: smollm2, 8 iterations x 2 runs per method
    python scripts/bench_prox.py [--workload tiny|smollm2] [--iterations N] [--repeats R] [--warmup W]
                                 [--methods recompute,loglinear,linear] [key=value ...]

Every run is its own ``python -m lit_ppo fit`` subprocess in a directory of its own, one at a time,
interleaved across repetitions (recompute, loglinear, linear, recompute, ...) so that drifting machine
load hits every method alike. Seconds per iteration are read from the progress lines (``s/it``) after
``--warmup`` iterations; the table gives their median per method, its ratio to recompute, and the mean
training reward of the last half of the iterations (the approximations should not change what is
learned). The model is loaded once before timing (SmolLM2's GGUF conversion is not measured).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["algo=icepop", "rollout.max_head_offpolicyness=1", "eval.max_problems=0",
          "checkpoint.every_n_iterations=1000", "logger=none"]
WORKLOADS = {
    "tiny": ["model=tiny"],
    "smollm2": ["model=smollm2", "data=gsm_symbolic", "data.batch_size=2", "gconfig.n_samples=4",
                "gconfig.max_new_tokens=64"],
}
PROGRESS = re.compile(r"^iteration (\d+)/\d+ reward ([-0-9.e]+) .* s/it ([0-9.e]+)", re.M)


def fit(overrides: list[str], cache: Path) -> list[tuple[float, float]]:
    """(reward, seconds) of each iteration of one run."""
    env = {**os.environ, "LIT_PPO_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="bench_prox_") as cwd:
        proc = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", *overrides], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"fit {' '.join(overrides)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return [(float(reward), float(seconds)) for _, reward, seconds in PROGRESS.findall(proc.stdout)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="the docs' numbers: smollm2, 8 iterations x 2 runs")
    parser.add_argument("--workload", choices=sorted(WORKLOADS))
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the timing")
    parser.add_argument("--methods", default="recompute,loglinear,linear")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "lit_ppo_bench_cache")
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args()
    workload = args.workload or ("smollm2" if args.full else "tiny")
    iterations = args.iterations or (8 if args.full else 12)
    repeats = args.repeats or (2 if args.full else 1)
    methods = args.methods.split(",")
    if iterations <= args.warmup:
        raise SystemExit(f"--iterations {iterations} must exceed --warmup {args.warmup}")

    from lit_ppo.models import load_causal_lm

    load_causal_lm(workload, args.cache)  # the conversion or build, once, before timing
    base = [*COMMON, *WORKLOADS[workload], f"trainer.max_steps={iterations}", *args.overrides]
    runs: dict[str, list[list[tuple[float, float]]]] = {m: [] for m in methods}
    for _ in range(repeats):
        for method in methods:
            runs[method].append(fit([*base, f"actor.prox_logp_method={method}"], args.cache))

    def seconds(method: str) -> float:
        return statistics.median(s for run in runs[method] for _, s in run[args.warmup:])

    def late_reward(method: str) -> float:
        return statistics.mean(r for run in runs[method] for r, _ in run[iterations // 2:])

    reference = seconds(methods[0])
    print(f"workload {workload}: {iterations} iterations x {repeats} run(s) per method, {args.warmup} warm-up "
          f"iteration(s) left out; {' '.join(base)}")
    print("| prox_logp_method | s/iteration (median) | vs " + methods[0] + " | reward, last half |")
    print("|---|---|---|---|")
    for method in methods:
        print(f"| {method} | {seconds(method):.3f} | {reference / seconds(method):.2f}x | {late_reward(method):.3f} |")


if __name__ == "__main__":
    main()

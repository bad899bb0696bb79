"""Asynchronous rollouts benchmark: iterations per second and reward against wall time of synchronous
training (rollout.max_head_offpolicyness=0) vs a producer thread up to k=1 or 2 policy versions ahead.

    python scripts/bench_async.py          # quick: tiny only, 40 iterations x 1 run per row (~1 min idle)
    python scripts/bench_async.py --full   # docs/benchmarks.md numbers: tiny (100 x 2) + smollm2 (8 x 1),
                                           # ~30 min, 2 cores
    python scripts/bench_async.py [--workloads tiny,smollm2] [--ks 0,1,2] [--iterations N] [--repeats R]
                                  [--threads 2] [--no-sync-ref] [--warmup 2] [--output FIGURE.png]
                                  [--json out.json] [key=value ...]
    python scripts/bench_async.py --workloads smollm2   # smollm2 smoke check: 4 iterations x 1 run per row

Every run is its own ``python -m lit_ppo fit algo=icepop ...`` subprocess (the decoupled loss, which
asynchronous rollouts need, for every k alike), one at a time, interleaved across repetitions
(k=0, k=1, k=2, k=0, ...) so that drifting machine load hits every k alike. Each run has the same
CPU threads in all (``--threads``, through OMP_NUM_THREADS / MKL_NUM_THREADS): k=0 generates and
then trains with all of them; k>0 gives the producer ``rollout.num_threads = threads // 2`` and the
trainer the rest. One more row (``--no-sync-ref`` drops it), k=0 with ``threads // 2`` threads, is
the reference that tells overlap from thread contention: on a machine shared with other work, k=0
with two OpenMP threads can be many times slower than with one (each parallel region waits for a
descheduled thread), while k>0 runs each thread with one. Evaluation is off
(``eval.max_problems=0``), so are checkpoints (``trainer.enable_checkpointing=false``,
``trainer.callbacks=[]``); the final model export happens after the last measured iteration.

Each child runs in its own temporary directory with its own MLflow store
(``MLFLOW_TRACKING_URI=sqlite:///<tmp>/mlflow.db``); the per-iteration metrics are read back with
their timestamps (``MlflowClient.get_metric_history``, ms). Iterations per second are counted from
the end of iteration ``--warmup`` to the end of the last one (the first iterations include engine
start and, for k>0, the producer's first batch); wall time in the figure is seconds since the MLflow
run started (before engine creation, the same for every k). ``LIT_PPO_CACHE`` points all children at
one cache (``--cache``, default ``<tmp>/lit_ppo_bench_cache``) and each workload's model is loaded
once before timing, so SmolLM2's GGUF conversion is not measured.

The table: per workload and k, iterations/s (median over runs) and its ratio to k=0, both as
iterations over the measured span and as 1 / the median interval between iterations (robust to
bursts of load from other processes on a shared machine; where the two disagree, the machine was
busy); the mean reward per iteration over the whole run and over its last fifth (at least 3
iterations; means over runs); after warm-up, the mean staleness (policy versions a trained token
lags), the mean wait of the trainer for a batch (k>0: ``time/wait_for_batch_s``) and the mean
generate / train seconds per iteration; and the machine's 1-minute load average at the end of the
runs (about ``--threads`` when the benchmark had the machine to itself). The figure: reward
(moving average, mean over runs on a common time grid) against wall time, one panel per workload,
one line per row of the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMON = ["algo=icepop", "eval.max_problems=0", "trainer.enable_checkpointing=false", "trainer.callbacks=[]",
          "trainer.enable_progress_bar=false"]
WORKLOADS = {
    # name: (overrides, model to load once before timing, (quick iterations, repeats), (full iterations, repeats))
    "tiny": (["model=tiny"], "tiny", (40, 1), (100, 2)),
    "smollm2": (["model=smollm2", "data=gsm_symbolic", "data.batch_size=2", "gconfig.n_samples=4",
                 "gconfig.max_new_tokens=64"], "smollm2", (4, 1), (8, 1)),
}
QUICK_WORKLOADS, FULL_WORKLOADS = ["tiny"], ["tiny", "smollm2"]
METRICS = ("rollout/reward_mean", "time/generate_s", "time/train_s", "time/wait_for_batch_s",
           "rollout/staleness_mean", "rollout/staleness_max", "rollout/queue_size", "rollout/dropped_stale")


def child_env(threads: int, cache: Path, tracking_db: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), LIT_PPO_CACHE=str(cache),
               MLFLOW_TRACKING_URI=f"sqlite:///{tracking_db}", MLFLOW_EXPERIMENT_NAME="bench_async",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


def read_metrics(tracking_db: Path) -> dict:
    """The run's per-iteration metrics: {key: [(step, seconds since run start, value), ...]}."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tracking_db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    if len(runs) != 1:
        raise RuntimeError(f"expected one MLflow run in {tracking_db}, found {len(runs)}")
    info = runs[0].info
    out = {}
    for key in METRICS:
        history = sorted(client.get_metric_history(info.run_id, key), key=lambda m: (m.step, m.timestamp))
        if history:
            out[key] = [(m.step, (m.timestamp - info.start_time) / 1000, m.value) for m in history]
    return out


def run(overrides: list[str], threads: int, cache: Path, timeout: float) -> dict:
    """One ``fit`` in its own directory and MLflow store: its metrics, or its error."""
    with tempfile.TemporaryDirectory(prefix="bench_async_") as cwd:
        db = Path(cwd) / "mlflow.db"
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "lit_ppo", "fit", *overrides], cwd=cwd,
                                  env=child_env(threads, cache, db), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return {"error": f"timed out after {timeout:.0f} s\n{stderr[-4000:]}", "wall": time.perf_counter() - start}
        wall = time.perf_counter() - start
        if proc.returncode:
            return {"error": f"exit code {proc.returncode}\n{proc.stderr[-4000:]}", "wall": wall}
        try:
            metrics = read_metrics(db)
        except Exception as e:  # a run that logged nothing: report it beside the others
            return {"error": f"reading metrics: {e}\n{proc.stderr[-2000:]}", "wall": wall}
    return {"metrics": metrics, "wall": wall, "load": os.getloadavg()[0]}


def summarize(r: dict, warmup: int) -> dict:
    """Iterations/s after warm-up and the run's means."""
    m = r["metrics"]
    reward = m["rollout/reward_mean"]
    times = [t for _, t, _ in reward]
    n = len(times)
    w = min(warmup, n - 2)
    its = (n - 1 - w) / (times[-1] - times[w]) if n >= 2 and times[-1] > times[w] else math.nan
    intervals = [b - a for a, b in zip(times[w:], times[w + 1:])]
    its_median = 1 / statistics.median(intervals) if intervals and statistics.median(intervals) > 0 else math.nan
    last = max(3, n // 5)

    def mean_after(key):
        values = [v for step, _, v in m.get(key, []) if step >= w]
        return statistics.mean(values) if values else math.nan

    return {"its": its, "its_median": its_median, "load": r.get("load", math.nan), "n": n,
            "reward": statistics.mean(v for *_, v in reward),
            "reward_last": statistics.mean(v for *_, v in reward[-last:]),
            "staleness": mean_after("rollout/staleness_mean"), "staleness_max": max(
                (v for *_, v in m.get("rollout/staleness_max", [])), default=math.nan),
            "wait": mean_after("time/wait_for_batch_s"), "gen": mean_after("time/generate_s"),
            "train": mean_after("time/train_s"), "dropped": sum(v for *_, v in m.get("rollout/dropped_stale", []))}


def fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(results: dict, warmup: int) -> str:
    lines = ["| workload | k | iterations/s | x k=0 | it/s (median interval) | x k=0 | reward (run) "
             "| reward (last 1/5) | staleness mean (max) | wait for batch s | generate s | train s | load | runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for workload, per_k in results.items():
        base = base_median = None
        for label, runs in per_k.items():
            ok = [summarize(r, warmup) for r in runs if "metrics" in r]
            failed = len(runs) - len(ok)
            runs_text = f"{len(ok)}" + (f" ({failed} failed)" if failed else "")
            if not ok:
                lines.append(f"| {workload} | {label} | failed |" + " |" * 11 + f" {runs_text} |")
                continue
            its = statistics.median(s["its"] for s in ok)
            its_median = statistics.median(s["its_median"] for s in ok)
            if base is None:  # the first configuration: k=0 with every thread
                base, base_median = its, its_median
            ratio = its / base if base else math.nan
            ratio_median = its_median / base_median if base_median else math.nan

            def mean(key):
                values = [s[key] for s in ok if not math.isnan(s[key])]
                return statistics.mean(values) if values else math.nan

            stale = f"{fmt(mean('staleness'), '.2f')} ({fmt(max(s['staleness_max'] for s in ok), '.0f')})"
            lines.append(f"| {workload} | {label} | {its:.3f} | {fmt(ratio, '.2f')} | {its_median:.3f} | "
                         f"{fmt(ratio_median, '.2f')} | {mean('reward'):.3f} | {mean('reward_last'):.3f} | {stale} | "
                         f"{fmt(mean('wait'))} | {fmt(mean('gen'))} | {fmt(mean('train'))} | "
                         f"{fmt(mean('load'), '.1f')} | {runs_text} |")
    return "\n".join(lines)


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def figure(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, (workload, per_k) in zip(axes[0], results.items()):
        for index, (label, runs) in enumerate(per_k.items()):
            color = f"C{index}"
            curves = []
            for r in runs:
                if "metrics" not in r:
                    continue
                reward = r["metrics"]["rollout/reward_mean"]
                t = np.array([t for _, t, _ in reward])
                y = np.array(moving_average([v for *_, v in reward], max(1, len(reward) // 10)))
                curves.append((t, y))
                ax.plot(t, y, color=color, alpha=0.25, linewidth=0.8)
            if not curves:
                continue
            grid = np.linspace(max(c[0][0] for c in curves), min(c[0][-1] for c in curves), 200)
            mean = np.mean([np.interp(grid, t, y) for t, y in curves], axis=0)
            ax.plot(grid, mean, color=color, linewidth=2, label=f"k={label}, {len(curves)} run(s)")
        ax.set_title(workload)
        ax.set_xlabel("wall time since the run started (s)")
        ax.set_ylabel("rollout/reward_mean (moving average)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(textwrap.fill(title, 60 * len(results)), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="tiny + smollm2 with enough iterations for curves")
    parser.add_argument("--workloads", help=f"comma-separated, of {', '.join(WORKLOADS)} (default: "
                                            f"{','.join(QUICK_WORKLOADS)}; --full: {','.join(FULL_WORKLOADS)})")
    parser.add_argument("--ks", default="0,1,2", help="rollout.max_head_offpolicyness values (default 0,1,2)")
    parser.add_argument("--iterations", type=int, help="trainer.max_steps of every run (default: per workload)")
    parser.add_argument("--repeats", type=int, help="runs per workload and k (default: per workload)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each whole process (default 2)")
    parser.add_argument("--sync-ref", action=argparse.BooleanOptionalAction, default=True,
                        help="also run k=0 with threads // 2 threads (default on): what the producer's share of "
                             "the cores does alone, and whether k=0 with every thread suffers from other load")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of iterations/s (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a run is killed (default 3600)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "lit_ppo_bench_cache",
                        help="LIT_PPO_CACHE of every run (models built / converted once)")
    parser.add_argument("--output", type=Path, help="the figure (default: docs/bench-async.png with "
                                                    "--full, else bench-async.png in the temporary directory)")
    parser.add_argument("--json", type=Path, help="also write every run's metrics here")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    workloads = (args.workloads.split(",") if args.workloads else FULL_WORKLOADS if args.full else QUICK_WORKLOADS)
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}: must be one of {', '.join(WORKLOADS)}")
    ks = sorted({int(k) for k in args.ks.split(",")})
    if args.threads < 2 and any(k > 0 for k in ks):
        parser.error("--threads must be at least 2 for k > 0 (one for the producer, one for the trainer)")
    # (label, k, threads of the whole process): k=0 with every thread first, the baseline of the ratios.
    configs = [(str(k), k, args.threads) for k in ks]
    if args.sync_ref and 0 in ks and args.threads > 1:
        configs.append((f"0 ({args.threads // 2} thr)", 0, args.threads // 2))

    # Build / convert each model once, outside the measured runs.
    for w in workloads:
        load = f"from lit_ppo.models import load_causal_lm; load_causal_lm({WORKLOADS[w][1]!r})"
        subprocess.run([sys.executable, "-c", load], check=True, capture_output=True,
                       env=child_env(args.threads, args.cache, args.cache / "unused.db"))

    results: dict[str, dict[int, list[dict]]] = {}
    settings = []
    for w in workloads:
        overrides, _, quick, full = WORKLOADS[w]
        iterations, repeats = full if args.full else quick
        iterations, repeats = args.iterations or iterations, args.repeats or repeats
        settings.append(f"{w}: {iterations} iterations x {repeats} run(s), {' '.join(overrides)}")
        results[w] = {label: [] for label, _, _ in configs}
        total = repeats * len(configs)
        for rep in range(repeats):
            for index, (label, k, threads) in enumerate(configs):
                extra = [f"rollout.max_head_offpolicyness={k}"]
                if k > 0:
                    extra.append(f"rollout.num_threads={threads // 2}")
                r = run([*COMMON, *overrides, *extra, f"trainer.max_steps={iterations}", *args.overrides],
                        threads, args.cache, args.timeout)
                results[w][label].append(r)
                done = rep * len(configs) + index + 1
                if "metrics" in r:
                    s = summarize(r, args.warmup)
                    print(f"[{w} {done}/{total}] k={label}: {s['its']:.3f} it/s ({s['its_median']:.3f} median "
                          f"interval), reward {s['reward']:.3f}, {s['n']} iterations, {r['wall']:.0f} s, "
                          f"load {r['load']:.1f}", file=sys.stderr, flush=True)
                else:
                    print(f"[{w} {done}/{total}] k={label} FAILED after {r['wall']:.0f} s: {r['error']}",
                          file=sys.stderr, flush=True)

    header = (f"algo=icepop, {args.threads} CPU threads per process (k>0: producer {args.threads // 2}, trainer "
              f"{args.threads - args.threads // 2}), iterations/s after {args.warmup} warm-up iterations")
    print(header)
    for line in settings:
        print(f"- {line}")
    print()
    print(table(results, args.warmup))
    if args.output is None:
        directory = ROOT / "docs" if args.full else Path(tempfile.gettempdir())
        args.output = directory / "bench-async.png"
    figure(results, args.output, header)
    print(f"\nfigure: {args.output}")
    if args.json:
        args.json.write_text(json.dumps(results))
    if any("error" in r for per_k in results.values() for runs in per_k.values() for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()

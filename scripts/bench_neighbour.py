"""A run beside a busy neighbour: the same short SmolLM2 ``validate`` and ``fit`` timed on an idle machine,
beside two busy processes and beside a second copy of itself, for ``rollout=vllm`` and ``rollout=hf``, with
the ratio of each to its idle time.

    python scripts/bench_neighbour.py           # quick (make bench): 8 test problems, 1 iteration, 1 run each
    python scripts/bench_neighbour.py --full    # 24 test problems, 2 iterations, 2 runs each (about an hour)
    python scripts/bench_neighbour.py [--model smollm2|tiny] [--engines vllm,hf] [--commands validate,fit]
                                      [--neighbours idle,busy,twin] [--problems N] [--iterations N] [--repeats R]
                                      [--env KEY=VALUE ...] [--json out.json] [key=value ...]

Every command is ``python -m lit_ppo validate|fit model=smollm2 data=gsm_symbolic rollout=<engine> ...`` in a
temporary directory of its own, one workload at a time; ``key=value`` arguments go to every command and
``--env KEY=VALUE`` into its environment (to try a thread setting: ``--env OMP_WAIT_POLICY=passive``). The
neighbours:

- ``idle``: nothing else of this benchmark runs (the machine's other load is reported: the 1-minute load
  average when the command ended);
- ``busy``: two processes spinning in a Python loop for the whole command, as two busy training processes
  hold two cores (the neighbour of the issue: other training jobs, a sweep's parallel fits, a browser);
- ``twin``: a second identical command started at the same moment; the time is the first one's.

The time is the command's wall time, its start (imports, model load, engine start) included, as its user
waits for it. The SmolLM2 weights are converted once into a shared cache (``LIT_PPO_CACHE``) before any
timing. The conditions of one workload run back to back, and with ``--repeats`` the rounds interleave
(idle, busy, twin, idle, ...), so that drifting load hits each alike; each row shows the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["logger=none", "trainer.enable_progress_bar=false"]
TASKS = {"smollm2": "gsm_symbolic", "tiny": "arithmetic"}
"""The task of each model: problems it can be scored on within its context."""
NEIGHBOURS = ("idle", "busy", "twin")
BUSY_PROCESSES = 2
"""Spinning processes of the ``busy`` neighbour: as many as the cores of the machine the issue measured."""


def command(subcommand: str, model: str, engine: str, problems: int, iterations: int,
            overrides: list[str]) -> list[str]:
    """The lit_ppo command of one workload."""
    args = [*COMMON, f"model={model}", f"data={TASKS[model]}", f"rollout={engine}"]
    if subcommand == "fit":
        args += [f"trainer.max_steps={iterations}", "data.batch_size=2", "gconfig.n_samples=4",
                 "gconfig.max_new_tokens=64", "eval.before_training=false", "eval.max_problems=0",
                 "trainer.enable_checkpointing=false"]
    else:
        args.append(f"eval.max_problems={problems}")
    return [sys.executable, "-m", "lit_ppo", subcommand, *args, *overrides]


def timed(argv: list[str], env: dict[str, str], neighbour: str) -> dict:
    """Run ``argv`` beside ``neighbour`` in a temporary directory: its wall seconds, the load average at its end and
    whether its threads slept while they waited (the run found the machine busy: ``OMP_WAIT_POLICY=PASSIVE``)."""
    with tempfile.TemporaryDirectory(prefix="bench_neighbour_") as tmp:
        others: list[subprocess.Popen] = []
        if neighbour == "busy":
            others = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY_PROCESSES)]
        elif neighbour == "twin":
            twin_dir = Path(tmp) / "twin"
            twin_dir.mkdir()
            others = [subprocess.Popen(argv, cwd=twin_dir, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)]
        start = time.perf_counter()
        try:
            result = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            load = os.getloadavg()[0]
        finally:
            for other in others:
                if neighbour == "busy":
                    other.kill()
                other.wait()
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv[3:])} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return {"wall_s": wall, "load": load, "passive": "OMP_WAIT_POLICY=PASSIVE" in result.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="24 problems, 2 iterations, 2 repeats")
    parser.add_argument("--model", default="smollm2", choices=sorted(TASKS),
                        help="smollm2, or tiny for a check of the script itself")
    parser.add_argument("--engines", default="vllm,hf")
    parser.add_argument("--commands", default="validate,fit")
    parser.add_argument("--neighbours", default=",".join(NEIGHBOURS))
    parser.add_argument("--problems", type=int)
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every command")
    args = parser.parse_args()
    problems = args.problems or (24 if args.full else 8)
    iterations = args.iterations or (2 if args.full else 1)
    repeats = args.repeats or (2 if args.full else 1)
    neighbours = args.neighbours.split(",")
    unknown = [n for n in neighbours if n not in NEIGHBOURS]
    if unknown:
        parser.error(f"--neighbours: {unknown[0]} is not one of {', '.join(NEIGHBOURS)}")

    cache = Path(tempfile.gettempdir()) / "lit_ppo_bench_neighbour_cache"
    env = {**os.environ, "LIT_PPO_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.update(dict(item.split("=", 1) for item in args.env))
    subprocess.run([sys.executable, "-c", "from lit_ppo.models import load_causal_lm; "
                    f"load_causal_lm({args.model!r}, {str(cache)!r})"], env=env, check=True, capture_output=True)

    results: dict[str, dict[str, list[dict]]] = {}
    for subcommand in args.commands.split(","):
        for engine in args.engines.split(","):
            argv = command(subcommand, args.model, engine, problems, iterations, args.overrides)
            rows = results.setdefault(f"{subcommand} rollout={engine}", {n: [] for n in neighbours})
            for _ in range(repeats):
                for neighbour in neighbours:
                    rows[neighbour].append(timed(argv, env, neighbour))
                    print(f"{subcommand} rollout={engine} {neighbour}: {rows[neighbour][-1]['wall_s']:.1f} s "
                          f"(load {rows[neighbour][-1]['load']:.1f}"
                          f"{', threads sleep' if rows[neighbour][-1]['passive'] else ''})", flush=True)

    print(f"\nwall seconds (median of {repeats}), ratio to idle; {problems} test problems, {iterations} iteration(s); "
          f"env {' '.join(args.env) or 'as given'}")
    header = "| workload | " + " | ".join(neighbours) + " |"
    print(header + "\n|" + "---|" * (len(neighbours) + 1))
    for workload, rows in results.items():
        medians = {n: statistics.median(r["wall_s"] for r in rows[n]) for n in neighbours}
        idle = medians.get("idle")
        cells = [f"{medians[n]:.1f}" + (f" ({medians[n] / idle:.2f}x)" if idle and n != "idle" else "")
                 for n in neighbours]
        print(f"| {workload} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"problems": problems, "iterations": iterations, "env": args.env,
                                         "overrides": args.overrides, "results": results}, indent=1))


if __name__ == "__main__":
    main()

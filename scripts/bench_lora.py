"""LoRA benchmark: peak RSS and seconds per RL iteration of LoRA (rank 8) vs full fine-tuning.

    python scripts/bench_lora.py [--steps 3] [--repeats 1] [--model smollm2]

Each run is its own subprocess through the real CLI (so its peak RSS is its own), LoRA and full
runs interleaved; the table reports the mean of each and the LoRA / full ratio. The first iteration
is left out of the time per iteration (engine creation and warm-up). The model is loaded once
before timing, so a first-use conversion (SmolLM2's GGUF) is not measured.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from bench_train import run  # the same measured child process: seconds per iteration and peak RSS

SMALL = ["algo=grpo", "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=16", "eval.max_problems=0"]
CONFIGS = {"full": [], "lora r=8": ["model.lora_rank=8"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-c", f"from lit_ppo.models import load_causal_lm; load_causal_lm({args.model!r})"],
                   check=True, capture_output=True)
    common = [*SMALL, f"model={args.model}"]
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _ in range(args.repeats):
        for name, extra in CONFIGS.items():
            results[name].append(run([*common, *extra], args.steps))
    rows = {}
    for name, runs in results.items():
        per_it = statistics.mean(t for r in runs for t in r["times"][1:])
        rows[name] = (statistics.mean(r["peak_mb"] for r in runs), per_it)
    full_mb, full_s = rows["full"]
    print(f"model={args.model}, {args.steps} iterations x {args.repeats} runs each, {' '.join(SMALL[1:])}")
    print(f"{'config':<12} {'peak RSS MB':>12} {'ratio':>7} {'s/iteration':>12} {'ratio':>7}")
    for name, (mb, s) in rows.items():
        print(f"{name:<12} {mb:>12.0f} {mb / full_mb:>7.2f} {s:>12.2f} {s / full_s:>7.2f}")


if __name__ == "__main__":
    main()

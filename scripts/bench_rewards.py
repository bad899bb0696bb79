"""Reward benchmark: a slow asynchronous reward function (a judge, a remote service) scored one call at a
time and with a batch's calls awaited together.

    python scripts/bench_rewards.py            # quick (make bench): a 0.1-second reward
    python scripts/bench_rewards.py --full     # docs/benchmarks.md numbers: a 1-second reward

The data=dataset task scores a batch's prompt groups with one call of each reward function per group
(``lit_ppo.tasks.dataset.DatasetTask.score_groups``); the calls of an ``async def`` function are awaited
together, ``data.task_kwargs.reward_concurrency`` at once. The same 32 completions (32 prompts, one
completion each) are scored with a concurrency of 1 and of 32; the table reports the seconds each took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from lit_ppo.tasks import DatasetTask
from lit_ppo.utils.imports import object_reference

SECONDS = {"value": 1.0}


async def slow_reward(completions, **kwargs):
    """Waits ``--seconds`` per call, as a judge's round trip does, then scores the completions' lengths."""
    await asyncio.sleep(SECONDS["value"])
    return [float(len(c)) for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="a 1-second reward (default: 0.1 s)")
    parser.add_argument("--prompts", type=int, default=32, help="prompt groups of the batch")
    parser.add_argument("--samples", type=int, default=1, help="completions per prompt")
    args = parser.parse_args()
    SECONDS["value"] = 1.0 if args.full else 0.1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(args.prompts)))
        print(f"{args.prompts} prompts x {args.samples} completions, "
              f"an async reward of {SECONDS['value']:g} s per call")
        print("| reward_concurrency | calls | seconds |")
        print("|---|---|---|")
        seconds = []
        for limit in (1, args.prompts):
            task = DatasetTask(train_path=str(path), reward_fns=[object_reference(slow_reward)],
                               reward_concurrency=limit)
            problems = list(task.problems("train"))
            texts = [[f"answer {k}" for k in range(args.samples)] for _ in problems]
            ids = [[[1]] * args.samples for _ in problems]
            start = time.perf_counter()
            scores = task.score_groups(problems, texts, ids, step=0)
            seconds.append(time.perf_counter() - start)
            assert all(len(s.rewards) == args.samples for s in scores)
            print(f"| {limit} | {len(problems)} | {seconds[-1]:.2f} |")
    print(f"\nall {args.prompts} at once / one at a time: {seconds[0] / seconds[1]:.1f}x faster")


if __name__ == "__main__":
    main()

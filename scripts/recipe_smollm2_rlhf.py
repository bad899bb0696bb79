"""Run the RLHF chain of docs/recipes.md on SmolLM2-135M-Instruct and measure it: a reward model trained on pairs
of a hidden rule (``lit_ppo.tasks.word_problem_preferences``: the correct answer, then the shorter), then PPO and
GRPO against it on held-out word problems.

    python scripts/recipe_smollm2_rlhf.py --seeds 0 [1 ...] [--algos ppo grpo] [--json out.json]
                                          [--rm-set key=value ...] [key=value ...]
    python scripts/recipe_smollm2_rlhf.py --write-prompts DIR    # the prompt files of the recipe, nothing else
    python scripts/recipe_smollm2_rlhf.py --from-json out.json   # the tables of saved runs

For each seed, every command is the recipe's own, run as a subprocess in a temporary directory with its own MLflow
store, one at a time: the prompt files (``--write-prompts``), ``python -m lit_ppo rm`` (``RM``, then the
``--rm-set`` overrides), and ``python -m lit_ppo fit recipe=smollm2_rlhf algo=ppo`` and ``algo=grpo`` (those of
``--algos``) with the reward model's directory and the hidden rule in ``reward_fns`` (weight 0: it only measures)
and the other ``key=value`` arguments. Read back: the reward model's held-out pair accuracy (its last ``rm epoch ...
val_accuracy`` line, on pairs of test problems it never trained on) and, from each fit's MLflow run, the greedy
evaluation on the held-out test prompts before training (step 0) and after each evaluation: ``eval/accuracy`` (the
hidden rule: the share answered correctly), ``eval/rewards/<reward model>/mean`` (the reward model's own normalised
score: a rise of it without one of the rule's is reward hacking) and ``eval/response_length``. Each command's wall
time and peak memory (the child's maximum resident set size, ``os.wait4``) are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULE = "lit_ppo.tasks.word_problem_preferences.correct"
RM_PROBLEMS = 64
"""The first train problems, whose pairs the reward model trains on (4 pairs each: 32 steps of 8); the RL
prompts are the train problems after them, and both are held out from the test problems."""
RM = ["model=smollm2", "data=word_problems", f"data.task_kwargs.num_train={RM_PROBLEMS}",
      "data.task_kwargs.num_test=32", "rm.pairs_fn=lit_ppo.tasks.word_problem_preferences.rule_pairs",
      "rm.max_length=256", "rm.batch_size=8", "actor.optimizer.lr=3e-5"]
"""The recipe's rm command: one pass over the 256 pairs of the first 64 train problems, then the 128 pairs of 32
test problems held out."""
ALGOS = ("ppo", "grpo")
EVALUATED = ("eval/accuracy", "eval/response_length")


def write_prompts(directory: Path, count: int = 1000) -> None:
    """``train.jsonl`` (``count`` word problems after the reward model's, none of them one of its texts) and
    ``test.jsonl`` (the task's 128 held-out test problems) in ``directory``, rows of prompt and answer."""
    from lit_ppo.tasks.word_problems import WordProblemsTask

    task = WordProblemsTask(num_train=5000, num_test=128)
    train = list(task.problems("train"))
    seen = {p.prompt for p in train[:RM_PROBLEMS]}
    prompts = []
    for problem in train[RM_PROBLEMS:]:
        if problem.prompt not in seen and len(prompts) < count:
            prompts.append(problem)
            seen.add(problem.prompt)
    directory.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train.jsonl", prompts), ("test.jsonl", task.problems("test"))):
        (directory / name).write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n"
                                              for p in problems))


def merged(overrides: list[str], later: list[str]) -> list[str]:
    """``overrides`` with those of ``later`` in the place of any of the same key, the others of ``later`` after
    them (Hydra refuses a key given twice)."""
    keys = {o.split("=", 1)[0] for o in later}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + later


def run(args: list[str], workdir: Path, cache: Path, name: str) -> dict:
    """One ``python -m lit_ppo`` command in ``workdir`` with its own MLflow store: its output, wall seconds and
    peak resident memory; raises with the command's last output on failure."""
    env = dict(os.environ, LIT_PPO_CACHE=str(cache), MLFLOW_TRACKING_URI=f"sqlite:///{workdir / 'mlflow.db'}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = workdir / f"{name}.log"
    start = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-m", "lit_ppo", *args], cwd=workdir, env=env, stdout=out,
                                 stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise RuntimeError(f"{' '.join(args)} exited {code}:\n{log.read_text()[-3000:]}")
    return {"output": log.read_text(), "wall_s": wall, "peak_rss_gib": usage.ru_maxrss / 2**20}


def read_evaluations(workdir: Path) -> dict:
    """The one MLflow run of ``workdir``: {metric: [(iteration, value)]} of ``EVALUATED`` and of the reward
    model's score (``eval/rewards/<its name>/mean``, stored as ``reward_model``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (run_,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (rm_metric,) = [k for k in run_.data.metrics
                    if k.startswith("eval/rewards/") and k.endswith("/mean") and k != "eval/rewards/correct/mean"]
    return {name: [(m.step, m.value) for m in sorted(client.get_metric_history(run_.info.run_id, key),
                                                     key=lambda m: m.step)]
            for name, key in [*((k, k) for k in EVALUATED), ("reward_model", rm_metric)]}


def chain(seed: int, rm_overrides: list[str], fit_overrides: list[str], tmp: Path, cache: Path,
          algos: tuple[str, ...] = ALGOS) -> Iterator[tuple]:
    """The recipe's commands for ``seed`` (the module docstring), with a fit for each of ``algos``, one at a time:
    each command's name and what it measured, as it ends."""
    workdir = tmp / f"seed{seed}"
    prompts = workdir / "rlhf"
    write_prompts(prompts)
    rm = run(["rm", *merged([*RM, f"seed={seed}", "logger=none"], rm_overrides)], workdir, cache, "rm")
    accuracy = re.findall(r"^rm epoch \d+ val_accuracy ([\d.]+)", rm["output"], re.M)
    model = re.search(r"^  model +(\S+) ", rm["output"], re.M).group(1)
    yield "rm", {"val_accuracy": float(accuracy[-1]) if accuracy else None, "wall_s": rm["wall_s"],
                 "peak_rss_gib": rm["peak_rss_gib"]}
    for algo in algos:
        fit_dir = workdir / algo
        fit_dir.mkdir()
        fit = run(["fit", *merged(["recipe=smollm2_rlhf", f"algo={algo}", f"seed={seed}",
                                   f"data.task_kwargs.train_path={prompts / 'train.jsonl'}",
                                   f"data.task_kwargs.test_path={prompts / 'test.jsonl'}",
                                   f"data.task_kwargs.reward_fns=[{workdir / model},{RULE}]"], fit_overrides)],
                  fit_dir, cache, algo)
        yield algo, {"evaluations": read_evaluations(fit_dir), "wall_s": fit["wall_s"],
                     "peak_rss_gib": fit["peak_rss_gib"]}


def report(runs: dict) -> None:
    """The table of ``runs`` (seed -> ``chain``'s result): per seed and algorithm, the reward model's held-out pair
    accuracy, and before -> after RL the hidden rule's accuracy, the reward model's score and the length; then
    each command's time and memory."""
    print("\n| seed | algo | reward model pair accuracy | hidden rule: accuracy before -> after | reward model's "
          "score before -> after | length before -> after |")
    print("|---|---|---|---|---|---|")
    for seed, r in runs.items():
        pair_accuracy = "-" if r["rm"]["val_accuracy"] is None else f"{r['rm']['val_accuracy']:.3f}"
        for algo in (a for a in ALGOS if a in r):
            e = r[algo]["evaluations"]

            def change(metric: str, digits: int) -> str:
                return f"{e[metric][0][1]:.{digits}f} -> {e[metric][-1][1]:.{digits}f}"

            print(f"| {seed} | {algo} | {pair_accuracy} | {change('eval/accuracy', 3)} | "
                  f"{change('reward_model', 2)} | {change('eval/response_length', 0)} |")
    print("\n| seed | command | whole command | peak memory |")
    print("|---|---|---|---|")
    for seed, r in runs.items():
        for command in (c for c in ("rm", *ALGOS) if c in r):
            cost = r[command]
            print(f"| {seed} | {command} | {cost['wall_s'] / 60:.1f} min | {cost['peak_rss_gib']:.1f} GiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS),
                        help="the algorithms trained against the reward model")
    parser.add_argument("--rm-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of the rm command (after the recipe's)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--cache", type=Path, help="LIT_PPO_CACHE for the children (default: lit_ppo's own)")
    parser.add_argument("--write-prompts", type=Path, metavar="DIR", help="write the prompt files only")
    parser.add_argument("--from-json", type=Path, help="report the numbers that --json wrote, running nothing")
    args, overrides = parser.parse_known_args()
    if args.write_prompts:
        write_prompts(args.write_prompts)
        return
    if args.from_json:
        report(json.loads(args.from_json.read_text()))
        return
    cache = args.cache or Path(os.environ.get("LIT_PPO_CACHE", Path.home() / ".cache" / "lit_ppo"))
    runs = {}
    with tempfile.TemporaryDirectory(prefix="recipe_rlhf_") as tmp:
        for seed in args.seeds:
            for command, measured in chain(seed, args.rm_set, overrides, Path(tmp), cache, tuple(args.algos)):
                runs.setdefault(seed, {})[command] = measured
                print(f"seed {seed}: {command} done ({measured['wall_s'] / 60:.1f} min)", flush=True)
                if args.json:  # after each command, so that a stopped run keeps what it finished
                    args.json.write_text(json.dumps(runs, indent=1))
    report(runs)


if __name__ == "__main__":
    main()

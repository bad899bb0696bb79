"""Reproduce the recipe ``recipe=smollm2_word_problems`` (docs/recipes.md): the untrained model's greedy
test accuracy, the recipe's fit for each seed, the figure and the numbers of the docs.

    python scripts/recipe_smollm2_word_problems.py                    # seeds 0-4 (~85 min, 2 cores)
    python scripts/recipe_smollm2_word_problems.py --seeds 0 [--output FIGURE.png] [--json out.json] [key=value ...]
    python scripts/recipe_smollm2_word_problems.py --from-json a.json [b.json ...] [--json merged.json]

Every command is the recipe's own, ``python -m lit_ppo <validate|fit> recipe=smollm2_word_problems seed=S
[key=value ...]``, run as a subprocess in a temporary directory with its own MLflow store, one at a time:
first ``validate`` (greedy, so one baseline serves every seed; its printed score is read), then one ``fit``
per seed, with ``eval.before_training=false`` (the baseline is that score). The fits' metrics are read back
from MLflow with their timestamps: ``eval/accuracy`` (greedy, held-out test problems) and
``rollout/reward_mean`` against iteration and against minutes since the run started; the sample completions
are the CompletionSamples artifacts of the first and the last logged iteration, and the greedy completions of
the first test problems by the untrained model and by each run's exported model (``<run dir>/model``, loaded
with transformers as any user of the export would). Peak memory is the child's maximum resident set size
(``os.wait4``). Extra ``key=value`` arguments go to every command (for a shorter check: ``trainer.max_steps=2
trainer.val_check_interval=1 eval.max_problems=8``).

Prints one table (per seed: the untrained accuracy, the accuracy at every evaluation, the gain, s/iteration,
wall minutes, peak memory; then the mean and smallest gain), where an iteration's time goes (the median
seconds of generation, update and weight push, from the run's own ``time/*`` metrics, and the completions
per second of each: those generated, every group the dynamic filter tried, and those trained on, the
accepted groups' ``rollout/accepted``) and the samples; draws accuracy and reward against iteration and
wall time, one line per seed. MLflow's steps are the iterations as printed (1-based).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipe=smollm2_word_problems"
METRICS = ("eval/accuracy", "rollout/reward_mean", "rollout/response_length", "time/generate_s", "time/train_s",
           "time/sync_s", "rollout/accepted", "rollout/rejected", "rollout/invalid_rewards")
GROUPS_TRIED = ("rollout/accepted", "rollout/rejected", "rollout/invalid_rewards")
"""An iteration's prompt groups: generated = all three, trained = the accepted ones (lit_ppo.rollout.collector)."""


def run(subcommand: str, overrides: list[str], workdir: Path, cache: Path) -> dict:
    """One ``python -m lit_ppo`` command in ``workdir`` with its own MLflow store: wall seconds and peak
    resident memory; raises with the command's last output on failure."""
    env = dict(os.environ, LIT_PPO_CACHE=str(cache), MLFLOW_TRACKING_URI=f"sqlite:///{workdir / 'mlflow.db'}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = workdir / f"{subcommand}.log"
    start = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-m", "lit_ppo", subcommand, RECIPE, *overrides], cwd=workdir,
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if child.returncode:
        raise RuntimeError(f"{subcommand} {' '.join(overrides)} exited {child.returncode}:\n"
                           f"{log.read_text()[-3000:]}")
    return {"wall_s": wall, "peak_rss_gib": usage.ru_maxrss / 2**20}


def read_run(workdir: Path) -> dict:
    """The one MLflow run of ``workdir``: {metric: [(iteration, minutes since start, value)]}, the completions
    of an iteration (prompts x samples per prompt, from its params) and its first and last logged samples
    (``{"iteration": k, "rows": [{column: value}]}``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (run_,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    start = run_.info.start_time
    metrics = {key: [(m.step, (m.timestamp - start) / 60e3, m.value)
                     for m in sorted(client.get_metric_history(run_.info.run_id, key), key=lambda m: m.step)]
               for key in METRICS}
    params = run_.data.params
    samples = sorted(a.path for a in client.list_artifacts(run_.info.run_id, "samples"))
    picked = {}
    for path in (samples[:1] + samples[-1:]) if samples else []:
        table = json.loads(Path(client.download_artifacts(run_.info.run_id, path, str(workdir))).read_text())
        rows = [dict(zip(table["columns"], values)) for values in table["data"]]
        picked[path] = {"iteration": rows[0]["iteration"] if rows else None, "rows": rows}
    return {"metrics": metrics, "samples": picked, "n_samples": int(params["gconfig.n_samples"]),
            "eval_problems": int(params["eval.max_problems"])}


def greedy_answers(model_dir: Path, max_new_tokens: int, count: int = 4) -> list[dict]:
    """The greedy completions of ``model_dir`` (a Hugging Face directory, as export writes it) for the
    first ``count`` test problems, as the evaluation generates them (chat template, the run's
    ``gconfig.max_new_tokens``: the recipe's 96)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_ppo.tasks.word_problems import WordProblemsTask, last_number

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    for problem in list(WordProblemsTask().problems("test"))[:count]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": problem.prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.eos_token_id)
        completion = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        rows.append({"prompt": problem.prompt, "answer": problem.answer, "completion": completion,
                     "correct": last_number(completion) == problem.answer})
    return rows


def plot(results: dict, baseline: float, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for seed, result in results.items():
        m = result["metrics"]
        # The metrics of iteration k (its evaluation too) are logged at step k; the untrained baseline is
        # at 0. x is the iteration or the minutes since the run started.
        acc, reward = m["eval/accuracy"], m["rollout/reward_mean"]
        axes[0][0].plot([0] + [p[0] for p in acc], [baseline] + [p[2] for p in acc], marker="o", label=f"seed {seed}")
        axes[0][1].plot([0] + [p[1] for p in acc], [baseline] + [p[2] for p in acc], marker="o", label=f"seed {seed}")
        axes[1][0].plot([p[0] for p in reward], [p[2] for p in reward], label=f"seed {seed}")
        axes[1][1].plot([p[1] for p in reward], [p[2] for p in reward], label=f"seed {seed}")
    problems = next(iter(results.values()))["eval_problems"]
    axes[0][0].set_ylabel(f"eval/accuracy (greedy, {problems} held-out problems)")
    axes[1][0].set_ylabel("rollout/reward_mean (trained groups)")
    axes[1][0].set_xlabel("iteration")
    axes[1][1].set_xlabel("minutes (2-core CPU)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct, GRPO on word problems (recipe=smollm2_word_problems)")
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "recipe-smollm2-word-problems.png")
    parser.add_argument("--json", type=Path, help="write every number and sample here")
    parser.add_argument("--cache", type=Path, help="LIT_PPO_CACHE for the children (default: lit_ppo's own)")
    parser.add_argument("--from-json", type=Path, nargs="+",
                        help="report and draw the numbers that --json runs wrote (of the same untrained score), "
                             "running nothing")
    args, overrides = parser.parse_known_args()
    if args.from_json:
        saved = [json.loads(path.read_text()) for path in args.from_json]
        if len({s["baseline"] for s in saved}) > 1:
            sys.exit(f"error: --from-json: the files score the untrained model differently "
                     f"({', '.join(str(s['baseline']) for s in saved)}): they are of different settings")
        runs = dict(sorted((int(seed), r) for s in saved for seed, r in s["runs"].items()))
        if args.json:  # the files' runs as one
            args.json.write_text(json.dumps({"baseline": saved[0]["baseline"], "runs": runs}, indent=1))
        report(runs, saved[0]["baseline"], args.output)
        return
    cache = args.cache or Path(os.environ.get("LIT_PPO_CACHE", Path.home() / ".cache" / "lit_ppo"))
    with tempfile.TemporaryDirectory(prefix="recipe_") as tmp:
        base_dir = Path(tmp) / "baseline"
        base_dir.mkdir()
        base_cost = run("validate", overrides, base_dir, cache)
        # validate prints its scores as a table (eval/accuracy │ 0.17...); it starts no tracked run.
        baseline = float(re.search(r"eval/accuracy\W+([0-9.]+)", (base_dir / "validate.log").read_text()).group(1))
        print(f"untrained: eval/accuracy {baseline:.3f} ({base_cost['wall_s'] / 60:.1f} min)", flush=True)
        from lit_ppo.launch.compose import compose
        from lit_ppo.models import source_cache_entry

        max_new_tokens = compose([RECIPE, *overrides])["data"]["gconfig"]["max_new_tokens"]
        before = greedy_answers(source_cache_entry("smollm2", cache), max_new_tokens)
        results = {}
        for seed in args.seeds:
            workdir = Path(tmp) / f"seed{seed}"
            workdir.mkdir()
            cost = run("fit", [f"seed={seed}", "eval.before_training=false", *overrides], workdir, cache)
            (model_dir,) = workdir.glob("runs/*/*/model")  # the run's export of its final policy
            after = greedy_answers(model_dir, max_new_tokens)
            results[seed] = {**read_run(workdir), **cost, "greedy": {"before": before, "after": after}}
            acc = results[seed]["metrics"]["eval/accuracy"]
            print(f"seed {seed}: eval/accuracy {baseline:.3f} -> {acc[-1][2]:.3f} after {acc[-1][0]} iterations "
                  f"({cost['wall_s'] / 60:.1f} min)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"baseline": baseline, "runs": results}, indent=1))
    report(results, baseline, args.output)


def completions_per_iteration(run_: dict) -> tuple[float, float]:
    """The median completions an iteration of ``run_`` generated and trained on."""
    per_step: dict[int, list[float]] = {}
    for metric in GROUPS_TRIED:
        for step, _, value in run_["metrics"][metric]:
            per_step.setdefault(step, [0.0] * len(GROUPS_TRIED))[GROUPS_TRIED.index(metric)] = value
    n = run_["n_samples"]
    return (statistics.median(n * sum(groups) for groups in per_step.values()),
            statistics.median(n * groups[0] for groups in per_step.values()))


def report(results: dict, baseline: float, output: Path) -> None:
    """The tables, the samples and the figure of ``results`` (seed -> run) against the untrained ``baseline``."""
    evaluated = sorted({step for r in results.values() for step, _, _ in r["metrics"]["eval/accuracy"]})
    print("\n| seed | untrained | " + " | ".join(f"iteration {step}" for step in evaluated)
          + " | gain | s/iteration | whole command | peak memory |")
    print("|---|---|" + "---|" * len(evaluated) + "---|---|---|---|")
    gains = {}
    for seed, r in results.items():
        acc, reward = dict((p[0], p[2]) for p in r["metrics"]["eval/accuracy"]), r["metrics"]["rollout/reward_mean"]
        gains[seed] = acc[max(acc)] - baseline
        per_iteration = statistics.median(60 * (b[1] - a[1]) for a, b in zip(reward, reward[1:]))
        curve = " | ".join(f"{acc[step]:.3f}" if step in acc else "-" for step in evaluated)
        print(f"| {seed} | {baseline:.3f} | {curve} | {gains[seed]:+.3f} | {per_iteration:.0f} | "
              f"{r['wall_s'] / 60:.1f} min | {r['peak_rss_gib']:.1f} GiB |")
    print(f"\n{len(gains)} seeds: mean gain {statistics.mean(gains.values()):+.3f}, smallest "
          f"{min(gains.values()):+.3f} (seed {min(gains, key=gains.get)}), "
          f"on {next(iter(results.values()))['eval_problems']} held-out problems, greedy")
    print("\nWhere an iteration's time goes (medians over its iterations; completions/s: the completions the phase "
          "generated or trained on, per second):\n")
    print("| seed | generated | generate s | generated/s | trained | update s | trained/s | weight push s |")
    print("|---|---|---|---|---|---|---|---|")
    for seed, r in results.items():
        generated, trained = completions_per_iteration(r)
        generate_s, update_s, push_s = (statistics.median(p[2] for p in r["metrics"][m])
                                        for m in ("time/generate_s", "time/train_s", "time/sync_s"))
        print(f"| {seed} | {generated:.0f} | {generate_s:.1f} | {generated / generate_s:.1f} | {trained:.0f} | "
              f"{update_s:.1f} | {trained / update_s:.1f} | {push_s:.1f} |")
    for seed, r in results.items():
        for when, rows in r.get("greedy", {}).items():
            print(f"\nseed {seed}, greedy test completions {when} training:")
            for row in rows:
                verdict = "right" if row["correct"] else "wrong"
                print(f"  {verdict} ({row['answer']}): {row['completion'].strip()[:300]!r}")
        for path, logged in r["samples"].items():
            print(f"\nseed {seed}, {path} (iteration {logged['iteration']}):")
            for row in logged["rows"][:3]:
                print(f"  reward {row['reward']:.0f}: {row['completion'].strip()[:300]!r}")
    output.parent.mkdir(parents=True, exist_ok=True)
    plot(results, baseline, output)
    print(f"\nfigure: {output}")


if __name__ == "__main__":
    main()

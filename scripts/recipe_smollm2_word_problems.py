"""Reproduce the recipe ``recipe=smollm2_word_problems`` (docs/recipes.md): the untrained model's greedy
test accuracy, the recipe's fit for each seed, the figure and the numbers of the docs.

    python scripts/recipe_smollm2_word_problems.py                    # seeds 0 and 1 (~70 min, 2 cores)
    python scripts/recipe_smollm2_word_problems.py --seeds 0 [--output FIGURE.png] [--json out.json] [key=value ...]

Every command is the recipe's own, ``python -m lit_ppo <validate|fit> recipe=smollm2_word_problems seed=S
[key=value ...]``, run as a subprocess in a temporary directory with its own MLflow store, one at a time:
first ``validate`` (greedy, so one baseline serves every seed; its printed score is read), then one ``fit``
per seed. The fits' metrics are read back from MLflow with their timestamps: ``eval/accuracy`` (greedy, held-out test problems) and
``rollout/reward_mean`` against iteration and against minutes since the run started; the sample
completions are the CompletionSamples artifacts of the first and the last logged iteration, and the greedy
completions of the first test problems by the untrained model and by each run's exported model
(``<run dir>/model``, loaded with transformers as any user of the export would). Peak memory
is the child's maximum resident set size (``os.wait4``). Extra ``key=value`` arguments go to every
command (for a shorter check: ``trainer.max_steps=2 trainer.val_check_interval=1 eval.max_problems=8``).

Prints one table (accuracy before and after per seed, the gain, s/iteration, wall minutes, peak memory),
where an iteration's time goes (the median seconds of generation, update and weight push, from the run's
own ``time/*`` metrics, and the samples per second of each: the iteration's completions over its
generation or update seconds) and the samples; draws accuracy and reward against iteration and wall
time, one line per seed. MLflow's steps are the iterations as printed (1-based).
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
           "time/sync_s")
PHASES = {"generate": "time/generate_s", "update": "time/train_s", "weight push": "time/sync_s"}
"""Where an iteration's seconds go: the phase -> its metric (lit_ppo.training.metrics, callbacks/weight_sync.py)."""


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
    return {"metrics": metrics, "samples": picked,
            "completions": int(params["data.batch_size"]) * int(params["gconfig.n_samples"])}


def greedy_answers(model_dir: Path, count: int = 4) -> list[dict]:
    """The greedy completions of ``model_dir`` (a Hugging Face directory, as export writes it) for the
    first ``count`` test problems, as the evaluation generates them (chat template, 96 new tokens)."""
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
            out = model.generate(**ids, do_sample=False, max_new_tokens=96, pad_token_id=tokenizer.eos_token_id)
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
    axes[0][0].set_ylabel("eval/accuracy (greedy, 128 test problems)")
    axes[1][0].set_ylabel("rollout/reward_mean (training batch)")
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
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "recipe-smollm2-word-problems.png")
    parser.add_argument("--json", type=Path, help="write every number and sample here")
    parser.add_argument("--cache", type=Path, help="LIT_PPO_CACHE for the children (default: lit_ppo's own)")
    parser.add_argument("--from-json", type=Path, help="report and draw the numbers a --json run wrote, running nothing")
    args, overrides = parser.parse_known_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        report({int(seed): r for seed, r in saved["runs"].items()}, saved["baseline"], args.output)
        return
    cache = args.cache or Path(os.environ.get("LIT_PPO_CACHE", Path.home() / ".cache" / "lit_ppo"))
    with tempfile.TemporaryDirectory(prefix="recipe_") as tmp:
        base_dir = Path(tmp) / "baseline"
        base_dir.mkdir()
        base_cost = run("validate", overrides, base_dir, cache)
        # validate prints its scores as a table (eval/accuracy │ 0.17...); it starts no tracked run.
        baseline = float(re.search(r"eval/accuracy\W+([0-9.]+)", (base_dir / "validate.log").read_text()).group(1))
        print(f"untrained: eval/accuracy {baseline:.3f} ({base_cost['wall_s'] / 60:.1f} min)", flush=True)
        from lit_ppo.models import source_cache_entry

        before = greedy_answers(source_cache_entry("smollm2", cache))
        results = {}
        for seed in args.seeds:
            workdir = Path(tmp) / f"seed{seed}"
            workdir.mkdir()
            cost = run("fit", [f"seed={seed}", *overrides], workdir, cache)
            (model_dir,) = workdir.glob("runs/*/*/model")  # the run's export of its final policy
            results[seed] = {**read_run(workdir), **cost, "greedy": {"before": before,
                                                                     "after": greedy_answers(model_dir)}}
            acc = results[seed]["metrics"]["eval/accuracy"]
            print(f"seed {seed}: eval/accuracy {baseline:.3f} -> {acc[-1][2]:.3f} after {acc[-1][0]} iterations "
                  f"({cost['wall_s'] / 60:.1f} min)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"baseline": baseline, "runs": results}, indent=1))
    report(results, baseline, args.output)


def report(results: dict, baseline: float, output: Path) -> None:
    """The table, the samples and the figure of ``results`` (seed -> run) against the untrained ``baseline``."""
    print("\n| seed | accuracy before | after | gain | iterations | s/iteration | minutes | peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for seed, r in results.items():
        acc, reward = r["metrics"]["eval/accuracy"], r["metrics"]["rollout/reward_mean"]
        per_iteration = statistics.median(60 * (b[1] - a[1]) for a, b in zip(reward, reward[1:]))
        print(f"| {seed} | {baseline:.3f} | {acc[-1][2]:.3f} | {acc[-1][2] - baseline:+.3f} | {reward[-1][0]} | "
              f"{per_iteration:.0f} | {r['wall_s'] / 60:.1f} | {r['peak_rss_gib']:.1f} GiB |")
    print("\nWhere an iteration's time goes (medians over its iterations; samples/s: its completions per second "
          "of the phase):\n")
    print("| seed | completions | " + " | ".join(f"{phase} s | {phase} samples/s" for phase in PHASES) + " |")
    print("|---|---|" + "---|---|" * len(PHASES))
    for seed, r in results.items():
        cells = []
        for metric in PHASES.values():
            seconds = statistics.median(p[2] for p in r["metrics"][metric])
            cells += [f"{seconds:.1f}", f"{r['completions'] / seconds:.1f}" if seconds > 0 else "-"]
        print(f"| {seed} | {r['completions']} | " + " | ".join(cells) + " |")
    for seed, r in results.items():
        for when, rows in r.get("greedy", {}).items():
            print(f"\nseed {seed}, greedy test completions {when} training:")
            for row in rows:
                print(f"  {'right' if row['correct'] else 'wrong'} ({row['answer']}): {row['completion'].strip()[:300]!r}")
        for path, logged in r["samples"].items():
            print(f"\nseed {seed}, {path} (iteration {logged['iteration']}):")
            for row in logged["rows"][:3]:
                print(f"  reward {row['reward']:.0f}: {row['completion'].strip()[:300]!r}")
    output.parent.mkdir(parents=True, exist_ok=True)
    plot(results, baseline, output)
    print(f"\nfigure: {output}")


if __name__ == "__main__":
    main()

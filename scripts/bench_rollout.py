"""Rollout benchmark: generation throughput of the HF engine vs the vLLM engine, side by side.

    python scripts/bench_rollout.py [--models tiny smollm2] [--workloads decode rollout]

Two workloads, each given to both engines with the same prompts and sampling parameters:

- ``decode``: --prompts short chat questions x --n samples, end token disallowed so that every
  sample has exactly --tokens tokens (equal lengths: raw decoding speed); best of 3 timed calls.
- ``rollout``: one training iteration's generation for the model's preset task (tiny:
  ``data=arithmetic``, smollm2: ``data=gsm_symbolic``): its first ``data.batch_size`` prompts x
  ``gconfig.n_samples``, its ``max_new_tokens``, temperature and token restriction, natural stops;
  one timed call. Completion lengths then vary, which is what rollouts look like in training.

Each engine is warmed up once before timing. The table reports generated tokens per second, the
seconds of the timed call and the vLLM / HF ratio, for vLLM with the policy's float32 weights
(exact log-probs) and, with --vllm_dtypes bfloat16, with bfloat16 weights (faster only on CPUs with
native bfloat16; log-probs then differ from the float32 trainer's).
"""

from __future__ import annotations

import argparse
import time

import torch

from lit_ppo.config import GenerationConfig
from lit_ppo.launch.compose import compose
from lit_ppo.models import load_causal_lm
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.training.datamodule import RolloutDataModule

QUESTIONS = ["What is 12 plus 7?", "Name a prime number above 50.", "Spell the word cat backwards.",
             "What is the capital of France?", "Count from one to five.", "What is 9 times 8?"]
PRESET_DATA = {"tiny": "arithmetic", "smollm2": "gsm_symbolic"}


def decode_workload(tok, vocab: int, args) -> tuple[list[list[int]], SamplingParams, int]:
    prompts = [tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
               for i in range(args.prompts)]
    everything_but_end = [t for t in range(vocab) if t != tok.eos_token_id]
    return prompts, SamplingParams(n=args.n, max_new_tokens=args.tokens, allowed_token_ids=everything_but_end,
                                   seed=0), 3


def rollout_workload(source: str, tok) -> tuple[list[list[int]], SamplingParams, int]:
    data = compose([f"model={source}", f"data={PRESET_DATA[source]}"])["data"]
    module = RolloutDataModule(task=data["task"], task_kwargs=data.get("task_kwargs"),
                               gconfig=GenerationConfig(**data["gconfig"]), batch_size=data["batch_size"])
    params = module.sampling_params(tok)
    params.seed = 0
    workflow = SingleTurnWorkflow(tok, module.task, params, module.rollout)
    problems = list(module.task.problems("train"))[:module.batch_size]
    return [workflow.prompt_ids(p) for p in problems], params, 1


def timed(engine, prompts: list[list[int]], params: SamplingParams, repeat: int) -> tuple[float, float]:
    """(generated tokens per second, seconds) of the fastest of ``repeat`` calls, after a warm-up."""
    engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=4, seed=1))
    best, generated = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        seconds = time.perf_counter() - start
        if seconds < best:
            best, generated = seconds, sum(len(c.token_ids) for group in out for c in group)
    return generated / best, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(PRESET_DATA))
    parser.add_argument("--workloads", nargs="+", default=["decode", "rollout"], choices=["decode", "rollout"])
    parser.add_argument("--prompts", type=int, default=16, help="decode workload: prompts")
    parser.add_argument("--n", type=int, default=4, help="decode workload: samples per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="decode workload: tokens per sample")
    parser.add_argument("--vllm_dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                        help="vLLM weight dtypes to time (HF always runs the policy's float32)")
    args = parser.parse_args()
    from lit_ppo.rollout.engines.vllm import VLLMEngine

    rows = []
    for source in args.models:
        model, tok = load_causal_lm(source)
        vocab = model.get_output_embeddings().weight.shape[0]
        workloads = {"decode": lambda: decode_workload(tok, vocab, args),
                     "rollout": lambda: rollout_workload(source, tok)}
        hf_engine = HFEngine(model, tok)
        vllm_engines = {dtype: VLLMEngine(model, tok, seed=0, dtype=dtype) for dtype in args.vllm_dtypes}
        for name in args.workloads:
            prompts, params, repeat = workloads[name]()
            shape = f"{len(prompts)}x{params.n}x{params.max_new_tokens}"
            hf = timed(hf_engine, prompts, params, repeat)
            for dtype, engine in vllm_engines.items():
                rows.append((source, name, shape, dtype, hf, timed(engine, prompts, params, repeat)))
        del model, hf_engine, vllm_engines
    print(f"threads={torch.get_num_threads()}; shape = prompts x samples x max new tokens")
    print(f"{'model':<8} {'workload':<8} {'shape':>10} {'HF tok/s':>9} {'HF s':>7} {'vLLM dtype':>10} "
          f"{'vLLM tok/s':>10} {'vLLM s':>7} {'vLLM/HF':>8}")
    for source, name, shape, dtype, (hf, hf_s), (vllm, vllm_s) in rows:
        print(f"{source:<8} {name:<8} {shape:>10} {hf:9.1f} {hf_s:7.1f} {dtype:>10} {vllm:10.1f} {vllm_s:7.1f} "
              f"{vllm / hf:7.1f}x")


if __name__ == "__main__":
    main()

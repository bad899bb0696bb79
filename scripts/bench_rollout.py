"""Rollout benchmark: generation throughput of the HF engine vs the vLLM engine, side by side.

    python scripts/bench_rollout.py [--models tiny smollm2] [--prompts 16] [--n 4] [--tokens 32]

Both engines get the same prompts and sampling parameters (temperature 1, end token disallowed so
every sample generates exactly --tokens tokens); each is warmed up once, then timed (best of 3).
The table reports generated tokens per second and the vLLM / HF ratio, for vLLM with the policy's
float32 weights (exact log-probs) and with bfloat16 weights (faster on CPUs with AVX-512 BF16;
log-probs then differ from the float32 trainer's).
"""

from __future__ import annotations

import argparse
import time

import torch

from lit_ppo.models import load_causal_lm
from lit_ppo.rollout.engine import SamplingParams
from lit_ppo.rollout.hf_engine import HFEngine

QUESTIONS = ["What is 12 plus 7?", "Name a prime number above 50.", "Spell the word cat backwards.",
             "What is the capital of France?", "Count from one to five.", "What is 9 times 8?"]


def tokens_per_s(engine, prompts: list[list[int]], params: SamplingParams, repeat: int = 3) -> float:
    engine.generate(prompts[:2], params)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
    generated = sum(len(c.token_ids) for group in out for c in group)
    return generated / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--vllm_dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                        help="vLLM weight dtypes to time (HF always runs the policy's float32)")
    args = parser.parse_args()
    from lit_ppo.rollout.vllm_engine import VLLMEngine

    rows = []
    for source in args.models:
        model, tok = load_causal_lm(source)
        prompts = [tok.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
                   for i in range(args.prompts)]
        vocab = model.get_output_embeddings().weight.shape[0]
        everything_but_end = [t for t in range(vocab) if t != tok.eos_token_id]
        params = SamplingParams(n=args.n, max_new_tokens=args.tokens, allowed_token_ids=everything_but_end, seed=0)
        hf = tokens_per_s(HFEngine(model, tok), prompts, params)
        rows.append((source, "float32", hf, tokens_per_s(VLLMEngine(model, tok, seed=0), prompts, params)))
        if "bfloat16" in args.vllm_dtypes:
            rows.append((source, "bfloat16", hf,
                         tokens_per_s(VLLMEngine(model, tok, seed=0, dtype="bfloat16"), prompts, params)))
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    print(f"{args.prompts} prompts x {args.n} samples x {args.tokens} tokens, threads={torch.get_num_threads()}")
    print(f"{'model':<10} {'HF tok/s':>10} {'vLLM dtype':>11} {'vLLM tok/s':>11} {'vLLM/HF':>8}")
    for source, dtype, hf, vllm in rows:
        print(f"{source:<10} {hf:10.1f} {dtype:>11} {vllm:11.1f} {vllm / hf:7.1f}x")


if __name__ == "__main__":
    main()

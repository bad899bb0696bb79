"""Prefix-sharing benchmark: the update's passes with each shared prompt computed once, or per row.

    python scripts/bench_prefix_sharing.py            # quick (make bench): the tiny model, 8-token answers
    python scripts/bench_prefix_sharing.py --full     # docs/benchmarks.md numbers: SmolLM2, the recipe's shape

The batch has the shape of an iteration of recipe=smollm2_word_problems: ``--prompts`` word problems
rendered with the model's chat template (SmolLM2's carries a system prompt common to all), each
with ``--samples`` answers of 30 (or fewer) to ``--max-new-tokens`` random tokens. Two passes are timed, as
the update runs them: forward and backward of the log-probs (with entropies) over the token-balanced
minibatches of ``lit_ppo.training.update.balanced_partition`` (``--minibatches``, one micro-batch
each), and a forward without gradients over the whole batch (the old / reference log-probs and
values). "default" is lit_ppo's forward, which runs a prefix tree where it is cheaper
(``lit_ppo.models.packing.chosen_prefix_tree``); "packed" is the same forward with prefix sharing off
(each row packed with its own prompt). The two alternate within one process, after one warm-up pass
each; the table reports medians and their ratio, the slots each computes (the default's layout per
pass), and the largest log-prob gap between them (float32 rounding).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lit_ppo.models import load_causal_lm, packing, token_logprobs
from lit_ppo.tasks.word_problems import WordProblemsTask
from lit_ppo.training.update import balanced_partition


def recipe_batch(tokenizer, prompts: int, samples: int, max_new_tokens: int, seed: int):
    """``(input_ids, attention_mask, loss_mask)``: chat-templated word problems, left-padded, each with
    ``samples`` answers of random tokens and lengths, right-padded."""
    g = torch.Generator().manual_seed(seed)
    problems = WordProblemsTask().problems("train")[:prompts]
    rendered = [list(tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)) for p in problems]
    width = max(map(len, rendered))
    rows = prompts * samples
    ids = torch.zeros(rows, width + max_new_tokens, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for r in range(rows):
        prompt = rendered[r // samples]
        answer = int(torch.randint(min(30, max_new_tokens), max_new_tokens + 1, (1,), generator=g))
        ids[r, width - len(prompt):width] = torch.tensor(prompt)
        ids[r, width:width + answer] = torch.randint(1, len(tokenizer), (answer,), generator=g)
        mask[r, width - len(prompt):width + answer] = True
    loss_mask = mask.clone()
    loss_mask[:, :width] = False
    return ids, mask, loss_mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="SmolLM2 with 96-token answers (default: tiny, 8)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per batch (the recipe's data.batch_size)")
    parser.add_argument("--samples", type=int, default=8, help="answers per prompt (gconfig.n_samples)")
    parser.add_argument("--max-new-tokens", type=int, help="longest answer (gconfig.max_new_tokens; default 96 "
                                                             "with --full, else 8)")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps (actor.ppo_n_minibatches)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each forward")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    args.model = "smollm2" if args.full else "tiny"
    args.max_new_tokens = args.max_new_tokens or (96 if args.full else 8)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(args.model)[:2]
    model.train()
    ids, mask, loss_mask = recipe_batch(tokenizer, args.prompts, args.samples, args.max_new_tokens, seed=0)
    minibatches = balanced_partition(loss_mask.sum(1).tolist(), args.minibatches)
    body = model.base_model
    if not (packing.packing_supported(body) and packing.prefix_tree_supported(body)):
        raise SystemExit(f"{args.model}: prefix sharing is off for this model, nothing to compare")
    supported = packing.prefix_tree_supported

    def run(sharing: bool, grad: bool) -> tuple[float, torch.Tensor]:
        packing.prefix_tree_supported = supported if sharing else (lambda body, device=None: False)
        logp = torch.zeros(ids.shape)
        start = time.perf_counter()
        try:
            for rows in minibatches if grad else [list(range(len(ids)))]:
                with torch.set_grad_enabled(grad):
                    lp, entropy = token_logprobs(model, ids[rows], mask[rows], loss_mask=loss_mask[rows],
                                                 with_entropy=grad)
                if grad:
                    (lp.sum() * 1e-3 + entropy.sum() * 1e-4).backward()
                logp[rows] = lp.detach()
        finally:
            packing.prefix_tree_supported = supported
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start, logp

    def slots(parts: list[list[int]]) -> tuple[int, int]:
        """Slots of the default forward and of packed rows over the passes on ``parts``."""
        default = packed = 0
        for rows in parts:
            flat = packing.plan_packing(mask[rows])
            tree = packing.chosen_prefix_tree(body, ids[rows], mask[rows]) or flat
            default, packed = default + tree.n_bins * tree.width, packed + flat.n_bins * flat.width
        return default, packed

    print(f"{args.model}: {args.prompts} prompts x {args.samples} answers, {int(mask.sum())} real tokens "
          f"({int(loss_mask.sum())} in answers); {args.threads} threads")
    print("| pass | packed s | default s | default / packed | slots packed | slots default | largest log-prob gap |")
    print("|---|---|---|---|---|---|---|")
    for grad, name in ((True, f"forward + backward, {len(minibatches)} minibatches"),
                       (False, "forward without gradients, whole batch")):
        times: dict[bool, list[float]] = {True: [], False: []}
        logps = {}
        for sharing in (False, True):
            run(sharing, grad)  # warm-up
        for _ in range(args.repeats):
            for sharing in (False, True):
                seconds, logps[sharing] = run(sharing, grad)
                times[sharing].append(seconds)
        packed, default = statistics.median(times[False]), statistics.median(times[True])
        gap = float((logps[True] - logps[False]).abs().max())
        default_slots, packed_slots = slots(minibatches if grad else [list(range(len(ids)))])
        print(f"| {name} | {packed:.2f} | {default:.2f} | {default / packed:.2f}x | {packed_slots} | {default_slots} "
              f"| {gap:.2g} |")


if __name__ == "__main__":
    main()

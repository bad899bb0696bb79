"""Algorithm-core benchmark: each batched implementation beside a reference, in one run.

    python scripts/bench_algos.py [--batch 256] [--length 1024]

Prints one table: milliseconds per call of each pair and their ratio, measured in one run so that
the ratio holds on a noisy shared machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from lit_ppo.algos import compute_gae, normalize, policy_loss
from lit_ppo.config import NormConfig, PPOActorConfig


def best_ms(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def gae_per_row(rewards, values, mask, gamma, lam):
    """Per-row Python loop over each row's generated tokens: the plain recurrence."""
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = mask[b].nonzero().flatten().tolist()
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            next_a = delta + gamma * lam * next_a
            next_v = values[b, t].item()
            out[b, t] = next_a
    return out


def group_norm_per_group(x, group_size, eps):
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], group_size):
        g = x[start:start + group_size].double()
        out[start:start + group_size] = ((g - g.mean()) / (g.std() + eps)).float()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    torch.manual_seed(0)
    B, T = args.batch, args.length
    prompt = T // 4
    lengths = torch.randint(1, T - prompt + 1, (B,))
    pos = torch.arange(T)
    mask = (pos >= prompt) & (pos < prompt + lengths[:, None])
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), prompt + lengths - 1] = torch.randn(B)
    values = torch.randn(B, T)

    rows = []
    fast = best_ms(lambda: compute_gae(rewards, values, mask, gamma=0.99, lam=0.95))
    slow = best_ms(lambda: gae_per_row(rewards, values, mask, 0.99, 0.95), repeat=1)
    rows.append(("compute_gae token", fast, "per-row python loop", slow))

    x = torch.randn(B * 16)
    cfg = NormConfig(mean_level="group", std_level="group", group_size=16)
    fast = best_ms(lambda: normalize(x, cfg))
    slow = best_ms(lambda: group_norm_per_group(x, 16, cfg.eps))
    rows.append(("normalize group", fast, "per-group loop", slow))

    logp = (torch.randn(B, T) * 0.1 - 1.0).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(B, T)
    adv = torch.randn(B, T)

    def loss_step(actor):
        def step():
            loss, _ = policy_loss(logp, old, adv, mask, actor)
            loss.backward()
        return step
    token_ms = best_ms(loss_step(PPOActorConfig()))
    gspo_ms = best_ms(loss_step(PPOActorConfig(importance_sampling_level="sequence")))
    rows.append(("policy_loss fwd+bwd token", token_ms, "GSPO sequence ratio", gspo_ms))

    print(f"B={B} T={T} (threads={torch.get_num_threads()})")
    print(f"{'implementation':<30} {'ms':>9}   {'reference':<22} {'ms':>9} {'ref/impl':>9}")
    for name, ms, ref, ref_ms in rows:
        print(f"{name:<30} {ms:9.2f}   {ref:<22} {ref_ms:9.2f} {ref_ms / ms:8.1f}x")


if __name__ == "__main__":
    main()

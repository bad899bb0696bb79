"""Log-prob path benchmark: lit_ppo's chunked log-probs vs ``log_softmax(logits).gather``.

    python scripts/bench_logprob.py            # quick: 512 and 1024 tokens
    python scripts/bench_logprob.py --full     # 512 to 4096 tokens

The LM head and the log-prob of each label under it (SmolLM2's shape: hidden 576, vocab 49152),
forward and backward (gradients of the hidden states and the head's weight), with and without the
entropy in the loss. "naive" keeps the float32 ``[tokens, vocab]`` log-softmax for its backward
pass; "lit_ppo" is ``lit_ppo.models.logprobs._SampledTokenLogprobs`` at ``model.logprob_chunk_size``. Each
measurement runs in its own process, interleaved naive / lit_ppo: one warm-up pass, then the repeats;
time is their median, peak memory their largest high-water mark above what the process held before
the pass (freed heap memory handed back to the system first, so that it neither counts nor hides a
peak). The values and gradients of both are compared too. "four matmuls / naive" is the time of the
head's three matmuls in the naive pass (the logits, the gradients of h and of the weight) plus the
logits' once more, the recompute, over the naive pass: the least a path that keeps no logits takes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, gc, json, sys, time
import torch
from lit_ppo.models.logprobs import _SampledTokenLogprobs

path, out = sys.argv[1], sys.argv[-1]
tokens, hidden, vocab, chunk, entropy, repeats, threads = map(int, sys.argv[2:-1])
torch.set_num_threads(threads)
torch.manual_seed(0)
h = torch.randn(tokens, hidden, requires_grad=True)
weight = (torch.randn(vocab, hidden) * 0.02).requires_grad_()
labels = torch.randint(0, vocab, (tokens,))
params = dict(temperature=1.0, top_k=0, top_p=1.0, allowed=None)


def naive():
    logp_all = torch.nn.functional.linear(h, weight).float().log_softmax(-1)
    logp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else torch.zeros_like(logp)
    return logp, ent


def lit_ppo():
    return _SampledTokenLogprobs.apply(h, weight, None, labels, params, chunk, bool(entropy))


def rss_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


fn = naive if path == "naive" else lit_ppo
trim = ctypes.CDLL("libc.so.6").malloc_trim  # hands freed heap memory back, so RSS is what is in use
times, peak = [], 0
for repeat in range(repeats + 1):  # the first pass warms up (thread pools, lazy initialisation)
    h.grad = weight.grad = None
    logp = ent = None
    gc.collect()
    trim(0)
    before = rss_kb("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    start = time.perf_counter()
    logp, ent = fn()
    (logp.sum() + (0.1 * ent.sum() if entropy else 0)).backward()
    if repeat:
        times.append(time.perf_counter() - start)
        peak = max(peak, rss_kb("VmHWM:") - before)
torch.save({"logp": logp.detach(), "ent": ent.detach(), "grad_h": h.grad, "grad_w": weight.grad}, out)
matmul_s = []
if path == "naive":  # the head's three matmuls alone: the logits, then the gradients of h and of the weight
    with torch.no_grad():
        x, w, g = h.detach(), weight.detach(), torch.randn(tokens, vocab)
        for product in (lambda: x @ w.t(), lambda: g @ w, lambda: g.t() @ x):
            product()
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                product()
                seconds.append(time.perf_counter() - start)
            matmul_s.append(sorted(seconds)[len(seconds) // 2])
print("BENCH " + json.dumps({"times": times, "peak_mb": peak / 1024, "matmul_s": matmul_s}))
"""


def measure(path: str, tokens: int, args, entropy: bool, out: str) -> dict:
    cmd = [sys.executable, "-c", CHILD, path, str(tokens), str(args.hidden), str(args.vocab), str(args.chunk_size),
           str(int(entropy)), str(args.repeats), str(args.threads), out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = [output for output in proc.stdout.splitlines() if output.startswith("BENCH ")]
    if proc.returncode or not line:
        raise RuntimeError(f"{path} at {tokens} tokens failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[0][6:])


def max_diff(a: str, b: str) -> float:
    import torch

    x, y = torch.load(a), torch.load(b)
    return max(float(((x[k] - y[k]).abs().max() / y[k].abs().max().clamp(min=1e-12))) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="sequence lengths 512 to 4096 (default: 512, 1024)")
    parser.add_argument("--tokens", help="comma-separated token counts (overrides --full)")
    parser.add_argument("--hidden", type=int, default=576, help="hidden size (default: SmolLM2's 576)")
    parser.add_argument("--vocab", type=int, default=49152, help="vocabulary size (default: SmolLM2's 49152)")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="positions per chunk (default: model.logprob_chunk_size)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per process; the median time is reported")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args()
    if args.chunk_size is None:
        from lit_ppo.config import ModelConfig

        args.chunk_size = ModelConfig().logprob_chunk_size
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else (
        [512, 1024, 2048, 4096] if args.full else [512, 1024])

    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for entropy in (False, True):
            for n in tokens:
                naive = measure("naive", n, args, entropy, f"{tmp}/naive.pt")
                ours = measure("lit_ppo", n, args, entropy, f"{tmp}/lit_ppo.pt")
                t_naive, t_ours = statistics.median(naive["times"]), statistics.median(ours["times"])
                # Keeping no logits costs one more logits matmul: the least time such a path can take.
                floor = (sum(naive["matmul_s"]) + naive["matmul_s"][0]) / t_naive
                rows.append((n, entropy, t_naive, t_ours, floor, naive["peak_mb"], ours["peak_mb"],
                             max_diff(f"{tmp}/lit_ppo.pt", f"{tmp}/naive.pt")))
                print(f"  {n} tokens, entropy {entropy}: {t_ours / t_naive:.2f}x time, "
                      f"{ours['peak_mb'] / max(naive['peak_mb'], 1e-9):.2f}x memory", file=sys.stderr)

    print(f"\nLog-prob path, forward + backward, hidden {args.hidden}, vocab {args.vocab}, "
          f"chunk {args.chunk_size}, {args.threads} threads, median of {args.repeats}; both peaks include the "
          f"head's weight gradient ({args.vocab * args.hidden * 4 / 2**20:.0f} MB)\n")
    print("| tokens | entropy | naive s | lit_ppo s | time ratio | four matmuls / naive | naive peak MB "
          "| lit_ppo peak MB | memory ratio | max rel. diff |")
    print("|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, entropy, t_naive, t_ours, floor, m_naive, m_ours, diff in rows:
        print(f"| {n} | {'yes' if entropy else 'no'} | {t_naive:.2f} | {t_ours:.2f} | {t_ours / t_naive:.2f}x "
              f"| {floor:.2f}x | {m_naive:.0f} | {m_ours:.0f} | {m_ours / max(m_naive, 1e-9):.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()

"""The benchmarks that ``make bench`` runs without TRL or long training, at toy sizes: they run and
print their tables, and what they compare agrees."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO


def run_script(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_bench_logprob_prints_equal_values_and_the_matmul_floor():
    out = run_script("bench_logprob.py", "--tokens", "24", "--hidden", "16", "--vocab", "96", "--chunk-size", "7",
                     "--repeats", "1", "--threads", "1")
    (header,) = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| tokens |")]
    assert header[5].strip() == "four matmuls / naive"
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("24", "no"), ("24", "yes")]
    for row in rows:
        assert float(row[-1]) < 1e-5  # max relative difference of values and gradients, lit_ppo vs naive
        # At toy sizes the head's matmuls are a vanishing share of the pass: 0.00x is a right value.
        assert float(row[5].strip().removesuffix("x")) >= 0


def test_bench_algos_prints_every_pair():
    out = run_script("bench_algos.py", "--batch", "4", "--length", "16")
    assert all(name in out for name in ("compute_gae token", "normalize group", "policy_loss fwd+bwd token"))


def test_bench_prefix_sharing_computes_fewer_slots_and_equal_logprobs():
    """On the tiny model with long prompts and 8-token answers the default forward shares each prompt:
    fewer slots than packed rows in both passes, the same log-probs."""
    out = run_script("bench_prefix_sharing.py", "--repeats", "1", "--threads", "1")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| forward")]
    assert [r[0].strip() for r in rows] == ["forward + backward, 4 minibatches",
                                            "forward without gradients, whole batch"]
    for row in rows:
        packed_slots, default_slots, gap = int(row[4]), int(row[5]), float(row[6])
        assert default_slots < packed_slots and gap < 1e-4


def test_bench_agents_batches_the_calls_of_episodes_in_flight():
    """With 8 episodes in flight their calls share engine calls; one at a time, each call is its own."""
    out = run_script("bench_agents.py", "--problems", "2", "--samples", "4", "--many", "8", "--max-tokens", "8",
                     "--threads", "1")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    (one, many) = [(int(r[0]), int(r[1]), int(r[4])) for r in rows]
    assert one == (1, 8, 16)  # 8 episodes of 2 calls: 16 engine calls
    assert many[:2] == (8, 8) and many[2] < 16
    assert re.search(r"8 in flight / 1: \d+\.\d\dx", out)


def test_bench_rewards_awaits_a_batch_s_slow_reward_calls_together():
    """8 calls of a 0.1-second asynchronous reward: one at a time about 0.8 s, all at once about 0.1 s."""
    out = run_script("bench_rewards.py", "--prompts", "8")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    (one, many) = [(int(r[0]), int(r[1]), float(r[2])) for r in rows]
    assert one[:2] == (1, 8) and many[:2] == (8, 8)
    assert one[2] >= 0.8 and many[2] < one[2] / 2


def test_bench_prox_times_every_method_of_the_same_run():
    """Four iterations of the tiny model per method: a table row per method, recompute's ratio 1.00x."""
    out = run_script("bench_prox.py", "--iterations", "4", "--warmup", "1")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| (recompute|loglinear|linear) \|", line)]
    assert [r[0].strip() for r in rows] == ["recompute", "loglinear", "linear"]
    assert rows[0][2].strip() == "1.00x" and all(float(r[1]) > 0 for r in rows)



def test_bench_neighbour_times_a_command_idle_and_beside_two_busy_processes():
    """The tiny model's validate of 2 problems, idle and beside two spinning processes on this 2-core machine:
    one row, the busy time the slower, with its ratio to the idle time. The commands take every core as torch
    threads (no OMP_NUM_THREADS, as a user runs them), and beside the busy processes they let them sleep."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    out = run_script("bench_neighbour.py", "--model", "tiny", "--engines", "hf", "--commands", "validate",
                     "--neighbours", "idle,busy", "--problems", "2", env=env)
    assert re.search(r"^validate rollout=hf busy: [\d.]+ s \(load [\d.]+, threads sleep\)$", out, re.M), out
    (row,) = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| validate rollout=hf |")]
    idle, busy = float(row[1]), re.fullmatch(r" ([\d.]+) \(([\d.]+)x\) ", row[2])
    assert idle > 0 and float(busy[1]) > idle
    # The ratio is of the unrounded seconds, printed to 0.1 s: it may differ from the printed seconds' ratio
    # by their rounding (0.05 s each) and its own (0.005).
    slower = float(busy[1])
    rounding = 0.005 + slower / idle * (0.05 / slower + 0.05 / (idle - 0.05))
    assert float(busy[2]) == pytest.approx(slower / idle, abs=rounding)

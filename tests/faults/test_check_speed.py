"""A wrong value is refused within two seconds, as the user types the command: the data section, its task
and its reward functions are checked before Lightning, transformers or torch load (they took 7 s to import
before the first check ran)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

BOUND_S = 2.0
"""The longest a refusal may take, start-up of the interpreter included."""
TRIES = 3
"""A refusal counts as quick when one of this many runs is: the machine is shared, and another process may
hold its cores through one run; a refusal that imports Lightning first takes 7 s every time."""

REWARDS = '''
def wrong_signature(x):
    return [0.0]
'''


@pytest.fixture
def dataset(tmp_path):
    rows = [{"prompt": f"What is {a}+1?", "answer": str(a + 1)} for a in range(4)]
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "bad.py").write_text(REWARDS)
    return tmp_path


@pytest.mark.parametrize("reward, line", [
    ("bad.wrong_signature",
     "error: data.task_kwargs.reward_fns[0]='bad.wrong_signature': wrong_signature(x) cannot take the keywords "
     "reward functions are called with (prompts, completions, completion_ids, trainer_state, answer): missing a "
     "required argument: 'x'; name its parameters after them and end with **kwargs, e.g. def "
     "wrong_signature(completions, **kwargs)"),
    ("bad.nope",
     "error: data.task_kwargs.reward_fns[0]='bad.nope' cannot be imported (module 'bad' has no 'nope'): give a "
     "dotted path module.function"),
])
def test_a_wrong_reward_function_is_refused_within_two_seconds(dataset, reward, line):
    command = [sys.executable, "-m", "lit_ppo", "fit", "algo=grpo", "data=dataset",
               "data.task_kwargs.train_path=train.jsonl", "data.task_kwargs.test_path=test.jsonl",
               f"data.task_kwargs.reward_fns=[{reward}]"]
    times = []
    for _ in range(TRIES):
        start = time.perf_counter()
        result = subprocess.run(command, cwd=dataset, capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - start)
        assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")
        assert not (dataset / "runs").exists()  # no run directory: nothing started
        if times[-1] <= BOUND_S:
            break
    assert min(times) <= BOUND_S, (f"refused after {', '.join(f'{t:.1f}' for t in times)} s in {len(times)} runs: "
                                   f"over {BOUND_S} s each time, so the check runs after a heavy import")

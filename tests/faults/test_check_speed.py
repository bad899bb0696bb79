"""A wrong value is refused within two seconds, as the user types the command: the data section, its task
and its reward functions are checked before Lightning, transformers or torch load (they took 7 s to import
before the first check ran); a teacher's tokenizer is read from its files without transformers' model code,
sft's examples without Lightning, and a resume's config from its checkpoint without Lightning (each took
5 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BOUND_S = 2.0
"""The longest a refusal may take, start-up of the interpreter included."""
TRIES = 3
"""A refusal counts as quick when one of this many runs is: the machine is shared, and another process may
hold its cores through one run; a refusal that imports Lightning first takes 7 s every time."""
CHECKPOINT_MARGIN_S = 0.8
"""What a check that reads a checkpoint may take beyond importing torch: the command line, its config
composed twice and the checkpoint read (a tiny model's); importing Lightning takes 2-3 s."""

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


def assert_refused_quickly(args: list[str], cwd: Path, line: str, reads_a_checkpoint: bool = False) -> None:
    """``python -m lit_ppo *args`` in ``cwd`` ends with ``line`` alone on stderr, exit code 2 and no run
    directory, within ``BOUND_S`` in one of ``TRIES`` runs. ``reads_a_checkpoint``: the check must load a
    checkpoint, which needs torch: it may take as long as importing torch (timed beside it) and
    ``CHECKPOINT_MARGIN_S`` more, and ``BOUND_S`` anyway; importing Lightning too takes seconds more."""
    command = [sys.executable, "-m", "lit_ppo", *args]
    env = {**os.environ, "LIT_PPO_CACHE": str(cwd / "cache")}
    runs = sorted(cwd.glob("runs/*/*"))
    times, bounds = [], []
    for _ in range(TRIES):
        bound = BOUND_S
        if reads_a_checkpoint:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=120)
            bound = max(bound, time.perf_counter() - start + CHECKPOINT_MARGIN_S)
        start = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
        times.append(time.perf_counter() - start)
        bounds.append(bound)
        assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "")
        assert sorted(cwd.glob("runs/*/*")) == runs  # no run directory: nothing started
        if times[-1] <= bound:
            return
    raise AssertionError(f"refused after {', '.join(f'{t:.1f}' for t in times)} s in {len(times)} runs, over "
                         f"{', '.join(f'{b:.1f}' for b in bounds)} s each time: the check runs after a heavy import")


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
    assert_refused_quickly(["fit", "algo=grpo", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                            "data.task_kwargs.test_path=test.jsonl", f"data.task_kwargs.reward_fns=[{reward}]"],
                           dataset, line)


def test_a_teacher_with_another_tokenizer_is_refused_within_two_seconds(tmp_path):
    from lit_ppo.models import TinyModelConfig, build_tiny

    model, tokenizer = build_tiny(TinyModelConfig(seed=1), tmp_path / "cache")
    model.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    data = json.loads((tmp_path / "teacher" / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]  # the same size, other ids
    (tmp_path / "teacher" / "tokenizer.json").write_text(json.dumps(data))
    assert_refused_quickly(["fit", "algo=opd", "model.teacher=teacher"], tmp_path, (
        "error: model.teacher=teacher has another tokenizer than the policy (80 against 80 entries; the policy's "
        "maps '1' to 7): the teacher scores the policy's token ids, so it must share its vocabulary"))


@pytest.mark.parametrize("job", ["sft", "rm"])
def test_examples_that_are_not_there_are_refused_within_two_seconds(tmp_path, job):
    assert_refused_quickly([job, "data=dataset", "data.task_kwargs.train_path=nope.jsonl"], tmp_path,
                           "error: data.task_kwargs.train_path='nope.jsonl': no such file or directory")


@pytest.mark.parametrize("override, line", [
    ("trainer.max_step=3", "error: trainer.max_step is not a key (did you mean trainer.max_steps?)"),
    ("trainer.gradient_clip_val=1.0", "error: trainer.gradient_clip_val=1.0 cannot be honoured: lit_ppo steps its "
     "optimizers itself (Lightning's manual optimization), so it clips with actor.optimizer.gradient_clipping (and "
     "critic.optimizer.gradient_clipping): set those"),
])
def test_a_wrong_trainer_argument_is_refused_within_two_seconds(tmp_path, override, line):
    """Lightning's argument names are known without importing Lightning (it took 10 s beside a busy neighbour)."""
    assert_refused_quickly(["fit", override], tmp_path, line)

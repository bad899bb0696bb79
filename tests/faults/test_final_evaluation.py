"""A failure in the final evaluation loses no training: last.ckpt of the final iteration is written
before the test split is scored, and the command fails with one line."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.conftest import run_cli

REWARDS = '''
def correct(prompts, completions, answer, **columns):
    """Needs the 'hint' column, which only the train split has (a parameter named hint would be refused
    before training: the test split could not fill it)."""
    columns["hint"]  # a KeyError on the test split
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
'''


@pytest.mark.slow
def test_a_reward_that_fails_on_the_test_split_keeps_the_finished_run(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)} for a in range(10) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({**r, "hint": "x"}) + "\n" for r in rows[8:]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    done = run_cli(["fit", "logger=none", "trainer.max_steps=2", "data.batch_size=2", "gconfig.n_samples=2",
                    "eval.max_problems=4", "gconfig.max_new_tokens=4", "data=dataset",
                    "data.task_kwargs.train_path=train.jsonl", "data.task_kwargs.test_path=test.jsonl",
                    "data.task_kwargs.reward_fns=[my_rewards.correct]", "eval.before_training=false"], tmp_path,
                   env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "raised KeyError" in errors[0] and "'hint'" in errors[0], done.stderr[-3000:]
    (ckpt,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 2
    assert f"last.ckpt holds iteration 2 (training finished: export it with python -m lit_ppo export --ckpt_path " \
           f"{ckpt.resolve()} --output DIR)" in done.stderr

"""A TRL script's reward functions through the real CLI: ``trl.rewards`` and functions written the TRL way
(one positional parameter, ``async def``) on a chat dataset with a ``solution`` column, each function's
metrics in the logger and the summary, and a KeyboardInterrupt raised by a reward named as such."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from tests.integration.conftest import run_cli, run_dir

pytestmark = pytest.mark.slow

MY_REWARDS = textwrap.dedent('''
    import json


    def format_reward(completions, **kwargs):
        return [1.0 if "\\\\boxed{" in c[0]["content"] else 0.0 for c in completions]


    async def length_reward(completions, completion_ids, trainer_state, **kwargs):
        with open("length_calls.jsonl", "a") as f:
            f.write(json.dumps({"step": trainer_state.global_step, "ids": completion_ids,
                                "texts": [c[0]["content"] for c in completions]}) + "\\n")
        return [float(len(ids)) for ids in completion_ids]


    def interrupting(prompts, completions, **kwargs):
        raise KeyboardInterrupt
''')
SMALL = ["algo=grpo", "data=dataset", "data.task_kwargs.train_path=train.jsonl", "trainer.max_steps=2",
         "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=6", "eval.max_problems=4"]


def chat(i: int) -> dict:
    return {"prompt": [{"role": "system", "content": "Box the answer."}, {"role": "user", "content": f"{i}+{i}="}],
            "solution": str(2 * i)}


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(chat(i)) + "\n" for i in range(8)))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(chat(i)) + "\n" for i in range(8, 12)))
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    return tmp_path


def test_trl_reward_functions_train_unchanged_and_are_logged_one_by_one(user_dir):
    result = run_cli(["fit", *SMALL, "logger=csv", "data.task_kwargs.test_path=test.jsonl",
                      "data.task_kwargs.reward_fns=[trl.rewards.accuracy_reward,trl.rewards.think_format_reward,"
                      "my_rewards.format_reward,my_rewards.length_reward]",
                      "data.task_kwargs.reward_weights=[1.0,1.0,1.0,0.0]", "eval.before_training=false"], user_dir,
                     timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (user_dir / "length_calls.jsonl").read_text().splitlines()]
    # Training: 2 groups of 2 per iteration, at global steps 0 and 1; then the final evaluation at step 2.
    assert [c["step"] for c in calls[:4]] == [0, 0, 1, 1] and {c["step"] for c in calls[4:]} == {2}
    assert all(len(c["ids"]) == len(c["texts"]) and all(1 <= len(ids) <= 6 for ids in c["ids"]) for c in calls)
    with open(run_dir(user_dir) / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    trained = [r for r in rows if r["rollout/reward_mean"]]
    for step, row in zip((0, 1), trained):
        texts = [t for c in calls if c["step"] == step for t in c["texts"]]
        lengths = [len(ids) for c in calls if c["step"] == step for ids in c["ids"]]
        assert float(row["rollout/rewards/format_reward/mean"]) == pytest.approx(
            sum("\\boxed{" in t for t in texts) / len(texts))
        assert float(row["rollout/rewards/length_reward/mean"]) == pytest.approx(sum(lengths) / len(lengths))
        for name in ("accuracy_reward", "think_format_reward"):
            assert row[f"rollout/rewards/{name}/mean"] != "" and row[f"rollout/rewards/{name}/std"] != ""
    (scored,) = [r for r in rows if r["eval/accuracy"]]
    # The greedy completion of each test problem (a group of one; pass@k's groups are larger).
    eval_lengths = [len(c["ids"][0]) for c in calls if c["step"] == 2 and len(c["ids"]) == 1]
    assert len(eval_lengths) == 4
    assert float(scored["eval/rewards/length_reward/mean"]) == pytest.approx(sum(eval_lengths) / len(eval_lengths))
    # Solved is accuracy_reward's value (the first function not about format), never the weighted sum.
    assert float(scored["eval/accuracy"]) == pytest.approx(float(scored["eval/rewards/accuracy_reward/mean"]))
    # Samples show the prompt as the model saw it (system message and chat template) and each function's value.
    samples = [json.loads(line) for line in (run_dir(user_dir) / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    for row in samples:
        assert row["model_input"].index("Box the answer.") < row["model_input"].index(row["prompt"])
        assert row["model_input"] != row["prompt"]
        assert row["rewards/format_reward"] == float("\\boxed{" in row["completion"])
        assert row["rewards/length_reward"] in [float(len(ids)) for c in calls[:2] for ids in c["ids"]]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("  rewards ")]
    assert sorted(part.split()[0] for part in line.split(None, 1)[1].split(", ")) == [
        "accuracy_reward", "format_reward", "length_reward", "think_format_reward"]


def test_a_keyboard_interrupt_raised_by_a_reward_is_its_failure(user_dir):
    result = run_cli(["fit", *SMALL, "logger=none", "data.task_kwargs.reward_fns=[my_rewards.interrupting]",
                      "data.task_kwargs.answer_key=null"], user_dir, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "reward function 'my_rewards.interrupting' raised KeyboardInterrupt for prompt" in last, last
    assert "sys.exit" not in result.stderr and "Traceback" not in result.stderr

"""The user's own data, reward functions and task class, from the working directory, through the real CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from tests.integration.conftest import REPO, run_cli, run_dir

SHRINK = ["trainer.max_steps=1", "data.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "logger=none",
          "eval.max_problems=4"]

MY_REWARDS = textwrap.dedent('''
    import json
    import os

    def correct(prompts, completions, answer, level, **kwargs):
        with open("reward_calls.jsonl", "a") as f:
            f.write(json.dumps({"prompts": prompts, "completions": completions, "answer": answer, "level": level,
                                "other": sorted(kwargs), "rank": os.environ.get("LOCAL_RANK", "0")}) + "\\n")
        return [float(c.strip() == a) for c, a in zip(completions, answer)]
''')

MY_TASK = textwrap.dedent('''
    from lit_ppo.tasks.base import Problem

    class MyTask:
        name = "mine"

        def __init__(self, seed=0, n=8):
            self.train = [Problem(prompt=f"{i}+{i}=", answer=str(2 * i % 10)) for i in range(n)]

        def problems(self, split):
            return self.train if split == "train" else []

        def reward(self, problem, completion):
            with open("task_calls.txt", "a") as f:
                f.write(problem.prompt + "\\n")
            return float(completion.strip() == problem.answer)

        def allowed_completion_tokens(self, tokenizer):
            return None
''')


def user_dir(cwd):
    """Write a user's train.jsonl, my_rewards.py and my_task.py into ``cwd``; the rows."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10), "level": a % 3}
            for a, b in ((i % 10, (3 * i + 1) % 10) for i in range(16))]
    (cwd / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cwd / "my_rewards.py").write_text(MY_REWARDS)
    (cwd / "my_task.py").write_text(MY_TASK)
    return rows


pytestmark = pytest.mark.slow


def test_own_data_and_reward_function_from_the_working_directory(tmp_path):
    rows = user_dir(tmp_path)
    result = run_cli(["fit", "algo=grpo", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                      "data.task_kwargs.reward_fns=[my_rewards.correct]", *SHRINK], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "reward_calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2  # one call per prompt group: 2 prompts x 2 samples
    by_prompt = {r["prompt"]: r for r in rows}
    for call in calls:
        prompt = call["prompts"][0]
        assert call["prompts"] == [prompt, prompt] and all(isinstance(c, str) for c in call["completions"])
        assert len(call["completions"]) == 2
        assert call["answer"] == [by_prompt[prompt]["answer"]] * 2 and call["level"] == [by_prompt[prompt]["level"]] * 2
        assert call["other"] == ["completion_ids", "trainer_state"]


def test_custom_task_class_from_the_working_directory(tmp_path):
    user_dir(tmp_path)
    result = run_cli(["fit", "algo=grpo", "data.task=my_task.MyTask", "+data.task_kwargs.n=6", *SHRINK],
                     tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    prompts = (tmp_path / "task_calls.txt").read_text().splitlines()
    assert len(prompts) == 4 and set(prompts) <= {f"{i}+{i}=" for i in range(6)}


def test_a_bad_reward_function_fails_before_any_model_loads(tmp_path):
    user_dir(tmp_path)
    result = run_cli(["fit", "algo=grpo", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                      "data.task_kwargs.reward_fns=[my_rewards.corect]", *SHRINK], tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.task_kwargs.reward_fns[0]='my_rewards.corect' cannot be imported (module 'my_rewards' has "
        "no 'corect'): give a dotted path module.function")
    assert not (tmp_path / "cache").exists()  # no model was built


def test_user_modules_import_on_every_ddp_rank(tmp_path):
    user_dir(tmp_path)
    result = run_cli(["fit", "algo=grpo", "trainer=ddp", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                      "data.task_kwargs.reward_fns=[my_rewards.correct]", *SHRINK], tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in (tmp_path / "reward_calls.jsonl").read_text().splitlines()]
    assert {c["rank"] for c in calls} == {"0", "1"}


def worked_example() -> tuple[dict[str, str], list[str]]:
    """The files (name -> text) and the commands of docs/bring-your-own.md's complete example."""
    page = (REPO / "docs" / "bring-your-own.md").read_text()
    section = page.split("## A complete example", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    files = {}
    for _, text in blocks:
        name = re.match(r"# (\S+\.py)", text)
        if name:
            files[name.group(1)] = text
    (commands,) = [text for lang, text in blocks if not lang and text.startswith("python ")]
    return files, commands.strip().splitlines()


def test_the_worked_example_runs_as_written(tmp_path):
    files, commands = worked_example()
    assert set(files) == {"make_data.py", "my_rewards.py"} and len(commands) == 4
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert commands[0] == "python make_data.py"
    subprocess.run([sys.executable, "make_data.py"], cwd=tmp_path, check=True)
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 500
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 100
    fit = shlex.split(commands[1])[3:]
    assert fit[0] == "fit" and "trainer.max_steps=100" in fit
    # As written, at the smallest scale: two iterations of two prompts x two samples, four test problems.
    scale = ("trainer.max_steps=", "data.batch_size=", "gconfig.n_samples=")
    fit = [a for a in fit if not a.startswith(scale)] + [
        "trainer.max_steps=2", "data.batch_size=2", "gconfig.n_samples=2", "eval.max_problems=4"]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    result = run_cli(fit, tmp_path, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^eval at iteration 2: accuracy [0-9.]+ reward_mean", result.stdout, re.M), result.stdout
    made = run_dir(tmp_path)
    assert made.name.startswith("grpo-dataset-tiny-")
    assert {p.name for p in (made / "model").iterdir()} == {
        "config.json", "generation_config.json", "lit_ppo_model.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja"}
    for command in commands[2:]:
        args = shlex.split(command.replace("runs/lit_ppo/<run>", str(made)))[3:]
        result = run_cli(args, tmp_path, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"eval/accuracy\W+[0-9]", result.stdout) is None  # the last one is export
    assert (tmp_path / "my-policy" / "model.safetensors").is_file()


def test_gdpo_normalises_each_reward_function_of_a_dataset_on_its_own(cli_here, monkeypatch):
    """algo=gdpo with two reward functions: every update's advantages come from the functions' values one by
    one (the decoupled operator sees both, with their weights), not from their sum."""
    import lit_ppo.algos.advantages as advantages

    user_dir(cli_here.cwd)
    seen = []
    original = advantages.normalize_then_sum

    def spy(terms, weights, cfg, group_sizes=None):
        seen.append((tuple(terms.shape), weights.tolist()))
        return original(terms, weights, cfg, group_sizes)

    monkeypatch.setattr(advantages, "normalize_then_sum", spy)
    result = cli_here("fit", "algo=gdpo", "data=dataset", "data.task_kwargs.train_path=train.jsonl",
                      "data.task_kwargs.reward_fns=[exact_match,format]", "data.task_kwargs.format_pattern='^[0-9]$'",
                      "data.task_kwargs.reward_weights=[1.0,0.5]", *SHRINK)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen == [((4, 2), [1.0, 0.5])]  # 2 prompts x 2 samples, 2 functions

"""docs/bring-your-own.md's TRL script, moved over as the docs say: its reward functions unchanged, a chat
dataset with a ``solution`` column, a local model directory; the command line and the Python script run on
the first try, at a real model's learning rate, each function logged, accuracy by the accuracy reward."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.integration.conftest import REPO, run_cli, run_dir
from tests.integration.test_own_model import _tiny_dir

pytestmark = pytest.mark.slow

SECTION = (REPO / "docs" / "bring-your-own.md").read_text().split("## Coming from TRL or verl")[1].split("\n## ")[0]
REWARDS, SCRIPT = re.findall(r"```python\n(.*?)```", SECTION, re.S)
(COMMAND,) = re.findall(r"```\n(python -m lit_ppo fit .*?)\n```", SECTION, re.S)
SMALLER = {"gconfig.n_samples": (8, 2), "gconfig.max_new_tokens": (256, 8), "trainer.max_steps": (100, 2)}
"""The documented sizes, and those the test trains with."""


def smaller(text: str, assign: str) -> str:
    for key, (documented, tested) in SMALLER.items():
        written = assign.format(key=key, value=documented)
        assert written in text, written
        text = text.replace(written, assign.format(key=key, value=tested))
    return text


def chat(i: int) -> dict:
    return {"prompt": [{"role": "system", "content": "Put the answer in \\boxed{}."},
                       {"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i)}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-user")
    _tiny_dir(root)  # root/my-model: a local Hugging Face model directory
    (root / "train.jsonl").write_text("".join(json.dumps(chat(i)) + "\n" for i in range(8)))
    (root / "test.jsonl").write_text("".join(json.dumps(chat(i)) + "\n" for i in range(8, 12)))
    (root / "my_rewards.py").write_text(REWARDS)
    return root


def test_the_reward_functions_are_a_trl_scripts():
    namespace: dict = {}
    exec(REWARDS, namespace)
    completions = [[{"role": "assistant", "content": "so \\boxed{4}"}], [{"role": "assistant", "content": "4"}]]
    assert namespace["format_reward"](completions) == [1.0, 0.0]
    assert namespace["accuracy_reward"](completions, solution=["4", "4"]) == [1.0, 0.0]


def test_the_command_line_runs_first_try(user_dir):
    args = shlex.split(smaller(COMMAND, "{key}={value}"))[3:]  # after "python -m lit_ppo"
    result = run_cli([*args, "logger=csv"], user_dir, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: model.source=")]
    assert len(notes) == 1 and "actor.optimizer.lr=1e-06" in notes[0], result.stderr[-3000:]
    with open(run_dir(user_dir) / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    trained = [r for r in rows if r["rollout/reward_mean"]]
    assert len(trained) == 2 and all(r["actor/lr"] and float(r["actor/lr"]) == pytest.approx(1e-6) for r in trained)
    for row in trained:
        parts = float(row["rollout/rewards/format_reward/mean"]) + float(row["rollout/rewards/accuracy_reward/mean"])
        assert float(row["rollout/reward_mean"]) == pytest.approx(parts)  # weights 1 and 1
    scored = [r for r in rows if r["eval/accuracy"]]
    assert [int(float(r["step"])) for r in scored] == [0, 2]  # the untrained policy's scores, then the final ones
    assert all(float(r["eval/accuracy"]) == float(r["eval/rewards/accuracy_reward/mean"]) for r in scored)


def test_the_python_script_runs_first_try(user_dir):
    script = smaller(SCRIPT, '"{key}": {value}').replace('"data=dataset",', '"data=dataset", "logger=none",')
    (user_dir / "train.py").write_text(script)
    env = {**os.environ, "HF_HOME": str(user_dir / "hf"), "HF_DATASETS_OFFLINE": "1",
           "LIT_PPO_CACHE": str(user_dir / "cache")}
    result = subprocess.run([sys.executable, "train.py"], cwd=user_dir, capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy, accuracy_reward = map(float, result.stdout.splitlines()[-1].split())
    assert 0 <= accuracy <= 1 and 0 <= accuracy_reward <= 1
    assert any(line.startswith("note: model.source=") and "actor.optimizer.lr=1e-06" in line
               for line in result.stderr.splitlines()), result.stderr[-3000:]

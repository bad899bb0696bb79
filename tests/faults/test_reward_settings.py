"""Reward settings that cannot work are refused in one line before any model loads (exit code 2): a function
that cannot take the keywords reward functions are called with, a built-in that needs an answer column the
data lacks, and no reward to decide what evaluation counts as solved."""

from __future__ import annotations

import json
import sys

import pytest

from tests.faults.test_bad_input import error_of

TRL_STYLE = '''
def format_reward(completions, **kwargs):
    return [float("\\\\boxed{" in c[0]["content"]) for c in completions]


def think_format(completions, **kwargs):
    return [float(c[0]["content"].startswith("<think>")) for c in completions]


def short_names(p, c):
    return [0.0] * len(c)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)
'''
DATA = ["data=dataset", "data.task_kwargs.train_path=train.jsonl", "logger=none"]


@pytest.fixture
def user_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "trl_style.py").write_text(TRL_STYLE)
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "solution": str(2 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield tmp_path
    sys.modules.pop("trl_style", None)


@pytest.mark.parametrize("args,expected", [
    (["data.task_kwargs.reward_fns=[trl_style.format_reward,trl_style.short_names]"],
     "data.task_kwargs.reward_fns[1]='trl_style.short_names': short_names(p, c) cannot take the keywords reward "
     "functions are called with (prompts, completions, completion_ids, trainer_state, solution): missing a required "
     "argument: 'p'; name its parameters after them and end with **kwargs, e.g. def short_names(completions, "
     "**kwargs)"),
    (["data.task_kwargs.reward_fns=[trl_style.no_kwargs]"],
     "data.task_kwargs.reward_fns[0]='trl_style.no_kwargs': no_kwargs(prompts, completions) cannot take the keywords "
     "reward functions are called with (prompts, completions, completion_ids, trainer_state, solution): got an "
     "unexpected keyword argument 'completion_ids'; name its parameters after them and end with **kwargs, e.g. "
     "def no_kwargs(completions, **kwargs)"),
    (["data.task_kwargs.reward_fns=[trl_style.format_reward,math_verify]"],
     "data.task_kwargs.answer_key='answer': train.jsonl has no column 'answer', which the reward 'math_verify' "
     "compares with; columns: prompt, solution"),
    (["data.task_kwargs.reward_fns=[format,trl_style.format_reward,trl_style.think_format]"],
     "data.task_kwargs.accuracy_reward is needed: every reward function is a format reward (format, format_reward, "
     "think_format); name the one whose value decides what evaluation counts as solved"),
    (["data.task_kwargs.reward_fns=[format,trl_style.format_reward]", "data.task_kwargs.accuracy_reward=correct"],
     "data.task_kwargs.accuracy_reward='correct' is not one of the reward functions: allowed: format, format_reward"),
])
def test_reward_settings_that_cannot_work_are_refused(capsys, user_cwd, no_model_loading, args, expected):
    assert error_of(capsys, *DATA, *args) == f"error: {expected}"


def test_a_column_named_like_a_reward_keyword_is_refused(capsys, user_cwd, no_model_loading):
    (user_cwd / "clash.jsonl").write_text(json.dumps({"prompt": "1+1=", "solution": "2", "completion_ids": [1]}) + "\n")
    assert error_of(capsys, "data=dataset", "data.task_kwargs.train_path=clash.jsonl", "logger=none",
                    "data.task_kwargs.reward_fns=[trl_style.format_reward]") == (
        "error: data.task_kwargs.train_path='clash.jsonl': has a column 'completion_ids', a keyword reward functions "
        "are called with (prompts, completions, completion_ids, trainer_state): rename the column")

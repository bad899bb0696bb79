"""The examples of ``python -m lit_ppo sft`` (lit_ppo.training.sft_data), on the tiny tokenizer, whose chat
template renders ``<|user|>text`` and ``<|assistant|>text<|end|>`` with one token per character: every
expected sequence below is written out from the template by hand."""

from __future__ import annotations

import json

import pytest
import torch

from lit_ppo.config.sft import SFTConfig
from lit_ppo.models import build_tiny_tokenizer, use_chat_template
from lit_ppo.tasks import build_task
from lit_ppo.tasks.base import Columns, Problem
from lit_ppo.training.sft_data import collate, step_batches
from lit_ppo.training.sft_examples import sft_problems, tokenize

USER, ASSISTANT, END, SYSTEM = "<|user|>", "<|assistant|>", "<|end|>", "<|system|>"


@pytest.fixture(scope="module")
def tok():
    return use_chat_template(build_tiny_tokenizer())


def ids(tok, *pieces: str) -> list[int]:
    """The ids of special tokens and characters, written out one piece at a time."""
    out = []
    for piece in pieces:
        out += ([tok.convert_tokens_to_ids(piece)] if piece.startswith("<|")
                else [tok.convert_tokens_to_ids(c) for c in piece])
    return out


def test_a_completion_follows_the_prompt_as_a_rollout_samples_it_and_only_it_counts(tok):
    problem = Problem(prompt="1+2=", answer="3", columns=Columns({"completion": "3"}))
    example = tokenize(tok, problem, SFTConfig(), None, "row 0")
    prompt, completion = ids(tok, USER, "1+2=", ASSISTANT), ids(tok, "3", END)
    assert list(example.input_ids) == prompt + completion
    assert list(example.loss_mask) == [False] * len(prompt) + [True] * len(completion)


def test_the_system_prompt_goes_first_as_in_a_rollout(tok):
    problem = Problem(prompt="2*2=", answer="4", columns=Columns({"completion": "4"}))
    example = tokenize(tok, problem, SFTConfig(), "Be brief.", "row 0")
    assert list(example.input_ids) == ids(tok, SYSTEM, "Be brief.", USER, "2*2=", ASSISTANT, "4", END)
    assert sum(example.loss_mask) == 2


def test_a_completion_template_writes_the_answer(tok):
    problem = Problem(prompt="7-5=", answer="2", columns=Columns({"level": 1}))
    cfg = SFTConfig(completion_template="<a>{answer}</a> (level {level})")
    example = tokenize(tok, problem, cfg, None, "row 0")
    counted = [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    assert counted == ids(tok, "<a>2</a> (level 1)", END)


def test_a_conversation_trains_every_assistant_message_and_nothing_else(tok):
    messages = ({"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
                {"role": "user", "content": "+3="}, {"role": "assistant", "content": "5"})
    example = tokenize(tok, Problem(prompt="+3=", answer="", messages=messages), SFTConfig(), None, "row 0")
    pieces = [(USER, False), ("1+1=", False), (ASSISTANT, False), ("2", True), (END, True),
              (USER, False), ("+3=", False), (ASSISTANT, False), ("5", True), (END, True)]
    assert list(example.input_ids) == ids(tok, *(p for p, _ in pieces))
    assert list(example.loss_mask) == [m for p, m in pieces for _ in ids(tok, p)]


def test_assistant_messages_as_the_completion_train_only_those(tok):
    # TRL's conversational prompt-completion: the prompt's own assistant turn is context.
    prompt = ({"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
              {"role": "user", "content": "+3="})
    problem = Problem(prompt="+3=", answer="", messages=prompt,
                      columns=Columns({"completion": [{"role": "assistant", "content": "5"}]}))
    example = tokenize(tok, problem, SFTConfig(), None, "row 0")
    counted = [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    assert counted == ids(tok, "5", END)
    assert list(example.input_ids) == ids(tok, USER, "1+1=", ASSISTANT, "2", END, USER, "+3=", ASSISTANT, "5", END)


def test_a_template_that_rewrites_earlier_turns_is_one_line(tok):
    rewriting = use_chat_template(build_tiny_tokenizer(), (
        "{%- for m in messages -%}{%- if m['role'] == 'assistant' and not loop.last -%}<|assistant|>x<|end|>"
        "{%- else -%}<|{{ m['role'] }}|>{{ m['content'] }}{%- if m['role'] == 'assistant' -%}<|end|>{%- endif -%}"
        "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"))
    messages = ({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"})
    with pytest.raises(ValueError, match=r"^row 3: the chat template renders the messages before message 2 "
                                         r"differently once it follows"):
        tokenize(rewriting, Problem(prompt="c", answer="", messages=messages), SFTConfig(), None, "row 3")


@pytest.mark.parametrize("problem, cfg, message", [
    (Problem(prompt="1+2=", answer="3", columns=Columns({"label": "x"})), SFTConfig(),
     r"^row 4 has no completion: give a 'completion' column \(sft.completion_key; its columns: label\), assistant "
     r"messages in its prompt, or sft.completion_template \(e.g. '<answer>\{answer\}</answer>'\)$"),
    (Problem(prompt="1+2=", answer="3", columns=Columns({"completion": 3})), SFTConfig(),
     r"^row 4, column 'completion': int is not a string or a list of assistant messages"),
    (Problem(prompt="1+2=", answer="3"), SFTConfig(completion_template="{answr}"),
     r"^sft.completion_template='\{answr\}': row 4 has no field 'answr': answer, prompt and the columns \(none\)"),
    (Problem(prompt="1+2=", answer="3", columns=Columns({"completion": "3" * 20})), SFTConfig(max_length=12),
     r"^row 4 is 27 tokens, more than sft.max_length=12: raise sft.max_length, or shorten the example$"),
])
def test_an_example_that_cannot_train_is_one_line_naming_its_row(tok, problem, cfg, message):
    with pytest.raises(ValueError, match=message):
        tokenize(tok, problem, cfg, None, "row 4")


@pytest.mark.parametrize("values, message", [
    ({"epochs": 0}, "sft.epochs=0 is invalid: must be a positive integer"),
    ({"batch_size": 2.5}, "sft.batch_size=2.5 is invalid: must be an integer"),
    ({"completion_template": "no field"}, "sft.completion_template='no field' is invalid: must be a format string "
                                          "naming a field"),
    ({"completion_template": "{unclosed"}, "sft.completion_template='{unclosed' is invalid: must be a Python format "
                                           "string"),
])
def test_bad_sft_settings_are_one_line(values, message):
    with pytest.raises(ValueError) as error:
        SFTConfig(**values)
    assert str(error.value).startswith(message)


def test_a_dataset_file_of_conversations_needs_no_prompt_column_and_holds_out_its_test_fraction(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}, {"role": "assistant", "content": str(i + 1)}]}
            for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = sft_problems("dataset", {"train_path": str(path), "test_fraction": 0.2, "seed": 0,
                                      "reward_fns": ["math_verify"], "answer_key": "answer"})
    assert (len(splits["train"]), len(splits["test"])) == (8, 2)
    prompts = sorted(p.problem.prompt for p in (*splits["train"], *splits["test"]))
    assert prompts == sorted(f"{i}+1=" for i in range(10))  # every row once, none lost
    assert all(p.problem.messages[-1]["role"] == "assistant" for p in splits["train"])
    # Each problem is named by its line of the file, held out or not: row i (its prompt i+1=) is line i + 1.
    for problem, where in (*splits["train"], *splits["test"]):
        assert where == f"{path} line {int(problem.prompt.split('+')[0]) + 1}"


def test_a_task_gives_its_own_problems_each_named_by_its_index():
    splits = sft_problems("arithmetic", {"seed": 0})
    task = build_task("arithmetic", seed=0)
    for split in ("train", "test"):
        assert [p.problem for p in splits[split]] == list(task.problems(split)) and splits[split]
        assert splits[split][3].where == f"data.task=arithmetic problems('{split}')[3]"


def test_collate_pads_right_and_keeps_each_mask(tok):
    a = tokenize(tok, Problem(prompt="1+2=", answer="", columns=Columns({"completion": "3"})), SFTConfig(), None, "a")
    b = tokenize(tok, Problem(prompt="10+20=", answer="", columns=Columns({"completion": "30"})), SFTConfig(), None,
                 "b")
    batch = collate([a, b], pad_id=0)
    assert batch["input_ids"].shape == (2, len(b.input_ids))
    assert batch["input_ids"][0].tolist() == list(a.input_ids) + [0] * (len(b.input_ids) - len(a.input_ids))
    assert batch["attention_mask"].sum(1).tolist() == [len(a.input_ids), len(b.input_ids)]
    assert batch["loss_mask"].sum(1).tolist() == [2, 3]
    assert batch["loss_mask"].dtype == torch.bool


def test_the_runs_batches_are_one_list_over_its_epochs_and_ranks():
    # In order: each epoch's 5 examples in batches of 2, the last of an epoch short.
    assert step_batches(5, 2, 2, False, 0, 1) == [[[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]]
    # Two ranks: the epoch topped up to 6 from its start, 2 x 1 per step, rank r every second from the r-th.
    assert step_batches(5, 1, 1, False, 0, 2) == [[[0], [2], [4]], [[1], [3], [0]]]
    # Shuffled: epoch e is the permutation of seed + e, every example once an epoch.
    (batches,) = step_batches(6, 4, 2, True, 7, 1)
    first = torch.randperm(6, generator=torch.Generator().manual_seed(7)).tolist()
    second = torch.randperm(6, generator=torch.Generator().manual_seed(8)).tolist()
    assert batches == [first[:4], first[4:], second[:4], second[4:]]

"""The preference pairs of ``python -m lit_ppo rm`` in TRL's forms (``lit_ppo.training.rm_examples``): each side
is the text that ``reward_fns`` scores for that completion, and every bad row is one line naming where it is."""

from __future__ import annotations

import json

import pytest

from lit_ppo.config.rm import RMConfig
from lit_ppo.models import build_tiny_tokenizer
from lit_ppo.training.rm_examples import PreferencePair, preference_pairs, row_pair, tokenize_pair

USER = [{"role": "user", "content": "2+3="}]


@pytest.mark.parametrize("row, prompt, chosen, rejected", [
    ({"prompt": "2+3=", "chosen": "5", "rejected": "6"}, "2+3=", "5", "6"),
    ({"prompt": USER, "chosen": [{"role": "assistant", "content": "5"}],
      "rejected": [{"role": "assistant", "content": "6"}]}, tuple(USER), "5", "6"),
    ({"chosen": [*USER, {"role": "assistant", "content": "5"}],
      "rejected": [*USER, {"role": "assistant", "content": "6"}]}, tuple(USER), "5", "6"),
    ({"chosen": "The sum is 5", "rejected": "The sum is 6"}, "The sum is", " 5", " 6"),
    ({"chosen": "2+3=5", "rejected": "2+3=14"}, "2+3=", "5", "14"),
])
def test_trl_preference_forms_give_the_prompt_and_both_completions(row, prompt, chosen, rejected):
    assert row_pair(row, "prompt", "p.jsonl line 1") == PreferencePair(prompt, chosen, rejected, 0.0, "p.jsonl line 1")


@pytest.mark.parametrize("row, line", [
    ({"prompt": "2+3=", "chosen": "5"},
     "p.jsonl line 3 has no column 'rejected': a pair holds chosen and rejected, with a 'prompt' column or the "
     "prompt at the start of both; its columns: prompt, chosen"),
    ({"prompt": "2+3=", "chosen": " ", "rejected": "6"},
     "p.jsonl line 3: its chosen completion is empty: each side of a pair needs a completion"),
    ({"prompt": "2+3=", "chosen": "5", "rejected": "5"},
     "p.jsonl line 3: its chosen and rejected completions are identical ('5'): a pair needs two different "
     "completions"),
    ({"chosen": [*USER, {"role": "assistant", "content": "5"}],
      "rejected": [{"role": "user", "content": "2+4="}, {"role": "assistant", "content": "6"}]},
     "p.jsonl line 3: the prompt differs between the sides (the messages before the last differ): both sides of a "
     "pair answer one prompt"),
    ({"chosen": "2+3=5", "rejected": "2+3=5"},
     "p.jsonl line 3: its chosen completion is empty: each side of a pair needs a completion"),
    ({"prompt": "2+3=", "chosen": "5", "rejected": "6", "margin": "big"},
     "p.jsonl line 3, column 'margin': 'big' is not a finite number"),
    ({"prompt": "2+3=", "chosen": [*USER, {"role": "assistant", "content": "5"}], "rejected": "6"},
     "p.jsonl line 3, column 'chosen': list is not a completion: give a string or one assistant message "
     "{role: assistant, content}"),
])
def test_a_bad_row_is_one_line_naming_it(row, line):
    with pytest.raises(ValueError) as e:
        row_pair(row, "prompt", "p.jsonl line 3")
    assert str(e.value) == line


def test_a_side_over_max_length_is_refused_naming_the_row():
    pair = row_pair({"prompt": "2+3=", "chosen": "5", "rejected": "6" * 20}, "prompt", "p.jsonl line 2")
    with pytest.raises(ValueError, match=r"^p.jsonl line 2: its rejected side is 27 tokens, more than "
                                         r"rm.max_length=10: raise rm.max_length, or shorten the pair$"):
        tokenize_pair(build_tiny_tokenizer(), pair, 10)


def test_rows_of_a_file_are_named_by_line_and_held_out_by_test_fraction(tmp_path):
    rows = [{"prompt": f"{i}=", "chosen": "1", "rejected": "2"} for i in range(10)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = preference_pairs("dataset", {"train_path": str(path), "test_fraction": 0.2}, RMConfig())
    assert (len(pairs["train"]), len(pairs["test"])) == (8, 2)
    assert sorted(p.where for p in pairs["train"] + pairs["test"]) == sorted(f"{path} line {i}" for i in range(1, 11))
    path.write_text(path.read_text() + json.dumps({"prompt": "x", "chosen": "1"}) + "\n")
    with pytest.raises(ValueError, match=rf"^{path} line 11 has no column 'rejected'"):
        preference_pairs("dataset", {"train_path": str(path)}, RMConfig())


def odd_pairs(problem):
    return [{"chosen": "1", "rejected": "2"}, {"chosen": "3", "rejected": "4", "margin": 0.5}]


def test_a_tasks_problems_become_pairs_through_pairs_fn_with_the_prompt_fit_gives_reward_functions():
    pairs = preference_pairs("arithmetic", {}, RMConfig(pairs_fn=f"{__name__}.odd_pairs"))
    first = pairs["train"][:2]
    assert [(p.chosen, p.rejected, p.margin) for p in first] == [("1", "2", 0.0), ("3", "4", 0.5)]
    assert first[0].where == "rm.pairs_fn of data.task=arithmetic problems('train')[0] pair 0"
    with pytest.raises(ValueError, match=r"^data.task=arithmetic gives problems, not pairs: give rm.pairs_fn="):
        preference_pairs("arithmetic", {}, RMConfig())

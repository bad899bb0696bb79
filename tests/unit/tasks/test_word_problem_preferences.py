"""The hidden rule of the RLHF recipe: correct answers first, then shorter ones; its pairs over word problems and
its reward function."""

from __future__ import annotations

from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.word_problem_preferences import correct, prefers, rule_pairs
from lit_ppo.tasks.word_problems import WordProblemsTask, last_number


def test_the_rule_ranks_correct_first_then_shorter():
    assert prefers("73 - 6 = 67.", "73 - 6 = 64.", "67")
    assert prefers("It is 67, since 73 - 6 = 67.", "64", "67")  # correct beats a shorter wrong answer
    assert prefers("67", "73 - 6 = 67.", "67") and not prefers("73 - 6 = 67.", "67", "67")
    assert not prefers("67", "67", "67")  # a tie is no preference


def test_every_pair_is_one_the_rule_decides():
    problems = list(WordProblemsTask(num_train=60).problems("train"))
    for problem in problems:
        pairs = rule_pairs(problem)
        assert len(pairs) == 4 and pairs == rule_pairs(problem)  # the same problem, the same pairs
        for pair in pairs:
            assert prefers(pair["chosen"], pair["rejected"], problem.answer)
        right, wrong = pairs[0]["chosen"], pairs[0]["rejected"]
        assert last_number(right) == problem.answer and last_number(wrong) != problem.answer
        # The same sentence, only the result differs: the arithmetic alone decides the first pair.
        result = last_number(wrong)
        assert wrong == right.replace(f"= {problem.answer}", f"= {result}").replace(f"is {problem.answer}",
                                                                                   f"is {result}")
        long, cut = pairs[1]["rejected"], pairs[2]["rejected"]
        assert len(long) > 2 * len(right) and pairs[2]["chosen"] == long  # the long answer
        # its start, cut off before the result: shorter, and wrong by the rule (its last number an operand)
        assert long.startswith(cut) and len(cut) < len(long) and last_number(cut) != problem.answer
        assert pairs[3]["rejected"] == cut and last_number(pairs[3]["chosen"]) == problem.answer
        assert len(pairs[3]["chosen"]) < len(cut)
    # All six templates (two per operation) are among the 60 problems.
    assert {sign for p in problems for sign in " + - * ".split() if f" {sign} " in rule_pairs(p)[0]["chosen"]} == {
        "+", "-", "*"}


def test_the_pairs_spell_out_the_problems_operation():
    pairs = rule_pairs(Problem(prompt="Noah has 73 shells and gives away 6 of them. How many shells does Noah have "
                                      "left?", answer="67"))
    assert "73 - 6 = 67" in pairs[0]["chosen"] and "73 - 6 = 67" in pairs[1]["rejected"]
    assert pairs[1]["rejected"].startswith("To find the answer, we need to subtract")
    assert pairs[2]["rejected"].endswith("73 - 6 =")
    pairs = rule_pairs(Problem(prompt="Mia buys 7 bags with 10 coins in each bag. How many coins does Mia buy in "
                                      "total?", answer="70"))
    assert "7 * 10 = 70" in pairs[0]["chosen"] and pairs[0]["chosen"].endswith("coins.")


def test_correct_is_the_rules_first_criterion_as_a_reward():
    assert correct(["p"] * 3, ["so 73 - 6 = 67", "67 shells, not 64", [{"role": "assistant", "content": "67"}]],
                   ["67", "67", "67"]) == [1.0, 0.0, 1.0]


def test_the_recipes_prompts_are_held_out_from_the_reward_models_problems_and_from_each_other(tmp_path):
    """scripts/recipe_smollm2_rlhf.py --write-prompts: RL prompts after the reward model's training problems, test
    prompts the task's held-out split; no text in two of the three."""
    import importlib.util
    import json
    from pathlib import Path

    script_path = Path(__file__).resolve().parents[3] / "scripts" / "recipe_smollm2_rlhf.py"
    spec = importlib.util.spec_from_file_location("recipe_rlhf", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.write_prompts(tmp_path, count=300)
    train, test = ([json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
                   for name in ("train.jsonl", "test.jsonl"))
    reward_model_problems = list(WordProblemsTask(num_train=script.RM_PROBLEMS).problems("train"))
    assert len(train) == 300 and len(test) == 128
    assert train[0]["prompt"] == list(WordProblemsTask().problems("train"))[script.RM_PROBLEMS].prompt
    texts = [{row["prompt"] for row in rows} for rows in (train, test)] + [{p.prompt for p in reward_model_problems}]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert all(row["answer"] == str(int(row["answer"])) for row in train + test)
    assert script.merged(["a=1", "b=2"], ["b=3", "c=4"]) == ["a=1", "b=3", "c=4"]


def test_the_cut_off_answer_stops_where_its_last_number_is_not_the_result():
    problem = Problem(prompt="Mia buys 1 bags with 10 coins in each bag. How many coins does Mia buy in total?",
                      answer="10")
    pairs = rule_pairs(problem)  # cut at "1 * 10 =" its last number would be the result
    assert len(pairs) == 4 and pairs[2]["rejected"].endswith("in the problem, 1 and")
    problem = Problem(prompt="Mia buys 1 bags with 1 coins in each bag. How many coins does Mia buy in total?",
                      answer="1")
    assert len(rule_pairs(problem)) == 2  # every cut ends on the result: no cut-off pairs

"""lit_ppo.utils.text: the names closest to a mistyped one, case ignored; a long text shortened."""

from lit_ppo.utils.text import closest, did_you_mean, one_of, shorten


def test_closest_ignores_case_and_offers_nothing_for_an_allowed_name():
    assert closest("GRPO", ["dapo", "grpo", "gspo"]) == ["grpo"]
    assert closest("grpo", ["grpo", "gspo"]) == []
    assert closest("lr_schedul", ["lr", "lr_schedule", "min_lr_ratio"]) == ["lr_schedule"]
    assert closest("zzz", ["grpo", "ppo"]) == []
    assert closest("gsm", ["gsm8k", "gsm_symbolic", "word_problems"], n=5, cutoff=0.5) == ["gsm8k"]


def test_closest_offers_no_name_of_other_words():
    # close in letters, another meaning: nothing offered
    assert closest("total_epochs", ["max_epochs", "min_epochs"]) == []
    assert closest("max_prompt_length", ["max_problems", "max_new_tokens"]) == []
    # a typo within each word, a letter's case, the underscores alone: offered
    assert closest("eps_clp", ["eps_clip", "eps_clip_higher"]) == ["eps_clip"]
    assert closest("max_stpes", ["max_steps", "max_epochs"]) == ["max_steps"]
    assert closest("drgrpo", ["dr_grpo", "grpo"]) == ["dr_grpo"]
    assert closest("tpu", ["cpu", "ddp"]) == ["cpu"]


def test_did_you_mean_and_one_of():
    assert (did_you_mean("Max_steps", ["max_steps", "min_steps"], prefix="trainer.")
            == " (did you mean trainer.max_steps?)")
    assert did_you_mean("xyz", ["max_steps"]) == ""
    assert [one_of(["a"]), one_of(["a", "b"]), one_of(["a", "b", "c"])] == ["a", "a or b", "a, b or c"]


def test_shorten_keeps_the_first_characters_and_marks_the_cut():
    assert shorten("abcdef", 6) == "abcdef"
    assert shorten("abcdefg", 6) == "abcdef..."
    assert shorten(repr("it's"), 3) == '"it...'

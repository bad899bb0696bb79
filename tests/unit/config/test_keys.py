"""lit_ppo.config.keys: the command line's name of a key and LightningCLI's, both directions derived from
the one table of sections; another trainer's names answered with lit_ppo's."""

import pytest

from lit_ppo.config.keys import (
    LIGHTNING_SECTIONS,
    ROLLOUT_KEYS,
    SECTIONS,
    foreign_key_answer,
    foreign_keys_error,
    lightning_path,
    typed_key,
)


@pytest.mark.parametrize("typed, lightning", [
    ("actor.eps_clip", "model.actor.eps_clip"), ("algo", "model.algo"), ("model.lora_rank", "model.model.lora_rank"),
    ("gconfig.n_samples", "data.gconfig.n_samples"), ("eval.k", "data.eval.k"), ("data.seed", "data.seed"),
    ("rollout.engine", "data.engine"), ("logger.init_args.run_name", "trainer.logger.init_args.run_name"),
    ("trainer.max_steps", "trainer.max_steps"), ("seed", "seed_everything"),
])
def test_both_names_of_a_key(typed, lightning):
    assert lightning_path(typed) == tuple(lightning.split("."))
    assert typed_key(lightning) == typed


def test_every_section_and_rollout_key_round_trips():
    keys = [f"{section}.field" for section in SECTIONS if section != "rollout"]
    keys += [f"rollout.{key}" for key in ROLLOUT_KEYS]
    assert [typed_key(".".join(lightning_path(key))) for key in keys] == keys


def test_keys_outside_the_sections():
    assert lightning_path("evaluation.k") is None and lightning_path("scheduler.nodes") is None
    assert typed_key("data.rollout_kwargs") == "data.rollout_kwargs"  # a data key, not one of rollout's
    assert LIGHTNING_SECTIONS == ("model", "data", "trainer", "seed_everything")


LIT_ROOTS = {*SECTIONS, "checkpoint", "samples", "scheduler", "recipe", "rejection"}


def test_a_foreign_name_is_found_whole_by_the_end_of_verls_or_by_trls_last_part():
    assert foreign_key_answer("data.max_response_length") == "verl's data.max_response_length is gconfig.max_new_tokens"
    # a bare name of several words that ends one of verl's dotted names is that name
    assert foreign_key_answer("train_batch_size") == "verl's data.train_batch_size is data.batch_size"
    assert foreign_key_answer("max_prompt_length").startswith("verl's data.max_prompt_length has no lit_ppo key (")
    # one word ends several of them or says too little to tell whose: no answer
    assert foreign_key_answer("lr") is None and foreign_key_answer("n") is None and foreign_key_answer("path") is None
    # TRL's bare names, by the last part of a dotted key
    assert foreign_key_answer("gconfig.learning_rate") == "TRL's learning_rate is actor.optimizer.lr"
    assert foreign_key_answer("actor.eps_clipp") is None


def test_every_foreign_name_of_a_command_and_no_key_of_lit_ppos_is_answered_at_once():
    keys = ["seed", "learning_rate", "gconfig.temperature", "lr", "data.max_response_length", "learning_rate"]
    assert foreign_keys_error(keys, LIT_ROOTS) == (
        "learning_rate and data.max_response_length are not keys: TRL's learning_rate is actor.optimizer.lr; "
        "verl's data.max_response_length is gconfig.max_new_tokens")
    assert foreign_keys_error(["top_k"], LIT_ROOTS) == "top_k is not a key: TRL's top_k is gconfig.top_k"
    # lit_ppo's own keys whose last part is a TRL name (gconfig.top_k) and unknown names are left to the
    # composition, which names what is close
    assert foreign_keys_error(["gconfig.top_k", "actor.eps_clp", "lr"], LIT_ROOTS) is None

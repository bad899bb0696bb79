"""The batches of ``python -m lit_ppo rm`` (``lit_ppo.training.rm_data``): both sides of each pair in one batch,
the chosen ones first, each side the text that ``reward_fns`` scores."""

from __future__ import annotations

from lit_ppo.models import build_tiny_tokenizer
from lit_ppo.tasks.rewards.model import reward_model_text
from lit_ppo.training.rm_data import collate_pairs
from lit_ppo.training.rm_examples import row_pair, tokenize_pair


def test_each_side_is_the_text_reward_fns_scores_and_the_batch_puts_chosen_first():
    tokenizer = build_tiny_tokenizer()
    pair = row_pair({"prompt": "2+3=", "chosen": "5", "rejected": "16", "margin": 1.5}, "prompt", "here")
    example = tokenize_pair(tokenizer, pair, 128)
    text = reward_model_text(tokenizer, "2+3=", "16")
    assert text == "<|user|>2+3=<|assistant|>16<|end|>"
    assert list(example.rejected_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = collate_pairs([example], tokenizer.pad_token_id)
    assert batch["input_ids"].shape == (2, len(example.rejected_ids)) and batch["margin"].tolist() == [1.5]
    assert batch["attention_mask"].sum(1).tolist() == [len(example.chosen_ids), len(example.rejected_ids)]

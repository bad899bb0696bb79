"""``lit_ppo.models.policy``: the policy of a ``ModelConfig``, ready to train, and its tokenizer alone."""

from __future__ import annotations

from lit_ppo.config import ModelConfig
from lit_ppo.models import load_policy, load_policy_tokenizer


def test_the_policy_trains_with_its_chat_template_and_the_tokenizer_alone_reads_alike(tmp_path):
    cfg = ModelConfig(source="tiny", cache_dir=str(tmp_path), gradient_checkpointing=True, chat_template="{{ 'x' }}")
    policy, tokenizer = load_policy(cfg)
    assert policy.training and policy.is_gradient_checkpointing
    assert tokenizer.chat_template == "{{ 'x' }}"
    alone = load_policy_tokenizer(cfg)
    messages = [{"role": "user", "content": "1+2="}]
    assert alone.apply_chat_template(messages, tokenize=True) == tokenizer.apply_chat_template(messages, tokenize=True)
    assert alone("1+2=3").input_ids == tokenizer("1+2=3").input_ids

"""LitSFT's loss (lit_ppo.training.sft): the negative log-likelihood of the counted tokens, against the
model's full logits log-softmaxed one position at a time."""

from __future__ import annotations

import torch

from lit_ppo.config import ModelConfig
from lit_ppo.config.sft import SFTActorConfig, SFTConfig
from lit_ppo.tasks.base import Columns, Problem
from lit_ppo.training.sft import LitSFT
from lit_ppo.training.sft_data import collate
from lit_ppo.training.sft_examples import tokenize


def test_the_loss_is_the_negative_log_likelihood_of_the_completion_tokens(tmp_path):
    module = LitSFT(ModelConfig(source="tiny", cache_dir=str(tmp_path), logprob_chunk_size=3), SFTActorConfig())
    examples = [tokenize(module.tokenizer, Problem(prompt=p, answer="", columns=Columns({"completion": c})),
                         SFTConfig(), None, "row") for p, c in (("1+2=", "3"), ("10+20=", "30"))]
    batch = collate(examples, module.tokenizer.pad_token_id)
    total, count = module.nll(batch)
    with torch.no_grad():
        logits = module.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    expected, n = 0.0, 0
    for b in range(2):
        for t in range(1, batch["input_ids"].shape[1]):
            if batch["loss_mask"][b, t]:
                expected -= float(torch.log_softmax(logits[b, t - 1], -1)[batch["input_ids"][b, t]])
                n += 1
    assert int(count) == n == 2 + 3  # "3" + end, "30" + end
    torch.testing.assert_close(total.detach(), torch.tensor(expected), rtol=1e-5, atol=1e-5)
    total.backward()  # the gradient reaches the policy
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.policy.parameters())

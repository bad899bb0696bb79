"""Log-probs under ``trainer.precision=bf16-mixed`` (Lightning's autocast over float32 master weights;
``lit_ppo.models.logprobs``), on CPU without downloads.

Tolerances are measured values with margin (this CPU, torch 2.13, seeds as below):
- tiny model (lit_ppo.models.build_tiny), 8 rows x 24 tokens: |bf16 - fp32| log-prob per token
  mean 0.0056, max 0.023 (over 4 data seeds x temperatures 1.0 / 0.7: mean <= 0.010, max <= 0.055);
  tested mean < 0.02, max < 0.08.
- random 4-layer Llama (hidden 256, vocab 4096), 8 rows x 64 tokens: mean 0.0017, max 0.0072 (3 model
  seeds x 2 data seeds: mean <= 0.0018, max <= 0.0093); tested mean < 0.005, max < 0.025.
- parameter gradients of sum(log-probs): relative error (norm of difference / norm) <= 0.017; tested < 0.05.
For scale: float32 recomputes agree to ~1e-6, and a real SmolLM2-135M in bf16 differs from float32
by 0.025 to 0.036 nats per token (mean over 350 sampled tokens; max 0.15 to 0.27).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_ppo.models import build_tiny, token_logprobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = build_tiny(cache_dir=tmp_path_factory.mktemp("cache"))
    return model.eval(), tok


def llama_4l() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                                        tie_word_embeddings=True)).eval()


def batch(vocab_size: int, rows: int = 8, width: int = 24, seed: int = 0):
    """Random tokens, rows of different lengths (right padding), the first 8 tokens a prompt."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (rows, width), generator=g)
    attention_mask = torch.ones(rows, width, dtype=torch.bool)
    for b in range(rows):
        attention_mask[b, width - 2 * b:] = False
    loss_mask = attention_mask.clone()
    loss_mask[:, :8] = False
    return input_ids, attention_mask, loss_mask


def grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = token_logprobs(model, input_ids, attention_mask, loss_mask=loss_mask)
    logp.sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name, width, mean_tol, max_tol", [("tiny", 24, 0.02, 0.08), ("llama_4l", 64, 0.005, 0.025)])
def test_bf16_autocast_logprobs_are_within_tolerance_of_fp32(tiny, name, width, mean_tol, max_tol):
    model = tiny[0] if name == "tiny" else llama_4l()
    input_ids, attention_mask, loss_mask = batch(model.config.vocab_size, width=width)
    fp32, fp32_grads = grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16=False)
    bf16, bf16_grads = grads_of_logprob_sum(model, input_ids, attention_mask, loss_mask, bf16=True)
    # The log-softmax is float32 under autocast (only the matmuls are bf16); master weights stay float32.
    assert bf16.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(g.dtype == torch.float32 for g in bf16_grads.values())
    diff = (bf16 - fp32).abs()[loss_mask]
    assert float(diff.mean()) < mean_tol and float(diff.max()) < max_tol, (float(diff.mean()), float(diff.max()))
    assert float(diff.mean()) > 1e-4  # the bf16 path really computed in bf16 (float32 agrees to ~1e-6)
    assert ((bf16 == 0) == ~loss_mask).all()
    for n, g in bf16_grads.items():
        ref = fp32_grads[n]
        assert float((g - ref).norm() / ref.norm().clamp(min=1e-30)) < 0.05, n
    model.zero_grad(set_to_none=True)

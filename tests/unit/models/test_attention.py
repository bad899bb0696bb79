"""``lit_ppo.models.attention``: attention in float32 under CPU autocast, transformers' sdpa otherwise; the
models lit_ppo loads use it, packing still holds, and the HF engine samples what the trainer computes."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lit_ppo.models import load_causal_lm
from lit_ppo.models.attention import NAME, float32_on_cpu_attention, use_float32_attention_on_cpu
from lit_ppo.models.packing import packed_hidden_states, packing_supported, padded_hidden_states
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import SamplingParams
from tests.unit.logprob_gap import gap

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def llama(attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=None, eos_token_id=1)
    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


def by_hand(q, k, v, causal_mask, scale):
    """softmax(q k^T * scale) v in float64, grouped-query heads repeated; [B, T, H, D] like transformers."""
    groups = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~causal_mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def test_under_cpu_autocast_the_attention_is_float32_and_otherwise_sdpa_unchanged():
    model = llama()
    module = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, 7, 16, generator=g).bfloat16() for h in (4, 2, 2))
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None].expand(3, 1, 7, 7)
    scale = 1 / math.sqrt(16)
    exact = by_hand(q, k, v, causal, scale)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = float32_on_cpu_attention(module, q, k, v, causal, scaling=scale)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        bf16, _ = sdpa_attention_forward(module, q, k, v, causal, scaling=scale)
    assert out.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    assert (out.double() - exact).abs().max() < 1e-6  # float32 rounding only
    assert (bf16.double() - exact).abs().max() > 1e-3  # what bfloat16 attention would give
    # Without autocast it is transformers' sdpa, bit for bit.
    q32, k32, v32 = q.float(), k.float(), v.float()
    ours, _ = float32_on_cpu_attention(module, q32, k32, v32, causal, scaling=scale)
    theirs, _ = sdpa_attention_forward(module, q32, k32, v32, causal, scaling=scale)
    assert torch.equal(ours, theirs)


def test_loaded_models_use_it_and_their_float32_results_do_not_change(tmp_path):
    model, _ = load_causal_lm("tiny", tmp_path)
    assert model.config._attn_implementation == NAME
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    ids = torch.randint(2, 40, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits,
                       plain(input_ids=ids, attention_mask=mask).logits)
    eager = llama("eager")
    use_float32_attention_on_cpu(eager)  # other implementations stay as they are
    assert eager.config._attn_implementation == "eager"


def test_packing_holds_with_it_under_autocast():
    model = llama()
    use_float32_attention_on_cpu(model)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 64, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, :3] = False
    mask[3, 2:] = False
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert packing_supported(model.model)
        packed = packed_hidden_states(model.model, ids, mask)
        padded = padded_hidden_states(model.model, ids, mask)
    assert (packed - padded)[mask].abs().max() < 2e-2 * padded[mask].abs().max()


def test_the_engine_samples_what_the_bf16_mixed_trainer_computes_with_it():
    model = llama()
    use_float32_attention_on_cpu(model)
    tok = type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0})()
    prompts = [[5, 9, 13, 2], [7, 3]]
    out = HFEngine(model, tok, autocast="bfloat16").generate(
        prompts, SamplingParams(n=4, max_new_tokens=8, temperature=1.0, seed=0))
    measured = gap(model, prompts, out, bf16=True)
    assert measured < 1e-5, measured  # measured 1e-7

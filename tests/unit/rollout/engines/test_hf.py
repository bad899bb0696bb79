"""Unit tests for ``lit_ppo.rollout.engines.hf.HFEngine`` on tiny randomly initialised Llama / GPT-2 models.

The core guarantee: the behaviour log-prob the engine reports for each sampled token equals an
independent recompute, one full forward over the unpadded prompt + completion followed by
``lit_ppo.models.sampling.sampling_logprobs`` with the same temperature, top-k, top-p and allowed tokens.
"""

from __future__ import annotations

import contextlib
import copy
import string

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lit_ppo.models import cpu_matmul
from lit_ppo.models.sampling import allowed_mask, sampling_logits, sampling_logprobs
from lit_ppo.rollout.engines import hf
from lit_ppo.rollout.engines.hf import HFEngine, _inverse_cdf
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams

SPECIALS = ["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
CHARS = string.digits + string.ascii_lowercase + " +-*=?.:"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: 5 special tokens (pad 0, eos 1) then one token per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                   additional_special_tokens=SPECIALS[2:], chat_template=CHAT_TEMPLATE)


def tiny_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """2-layer Llama; an init scale above the default 0.02 gives peaked distributions, so top-k / top-p really cut."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.15, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab_size: int, seed: int = 0) -> GPT2LMHeadModel:
    """2-layer GPT-2: absolute position embeddings, so left padding needs correct position ids
    (RoPE models are blind to a constant position shift)."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        initializer_range=0.15, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's
    thread handoff makes each small forward ~100x slower; restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(len(tok))


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def prompts(tok):
    # Different lengths (3, 12, 20 tokens), so the batch is left-padded.
    return [ids(tok, "hi:"), ids(tok, "what is 2+3?"), ids(tok, "a much longer prompt")]


def recompute(model, prompt: list[int], completion: list[int], **params) -> torch.Tensor:
    """Sampling log-probs of ``completion`` after ``prompt``: one full forward, no cache, no padding."""
    seq = torch.tensor(prompt + completion)[None]
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1:-1]
    return sampling_logprobs(logits, torch.tensor(completion), **params)


def support_sizes(model, prompt, completion, **params) -> list[int]:
    """Number of tokens with non-zero probability at each generation step."""
    seq = torch.tensor(prompt + completion)[None]
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1:-1]
    return torch.isfinite(sampling_logits(logits, **params)).sum(-1).tolist()


def test_implements_protocol(model, tok):
    assert isinstance(HFEngine(model, tok), RolloutEngine)
    assert HFEngine(model, tok).version == 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_behaviour_logprobs_equal_full_forward_recompute(arch, model, tok, prompts):
    model = model if arch == "llama" else tiny_gpt2(len(tok))
    allowed = list(range(1, 30))  # eos + digits + some letters
    dist = dict(temperature=0.7, top_k=12, top_p=0.8)
    # max_batch_size=4 over 9 rows: three decoding chunks with different left padding.
    engine = HFEngine(model, tok, max_batch_size=4)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=10, allowed_token_ids=allowed, seed=0, **dist))
    assert [len(group) for group in out] == [3, 3, 3]
    mask = allowed_mask(allowed, len(tok), "cpu")
    top_p_cut = False
    for prompt, group in zip(prompts, out):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            expected = recompute(model, prompt, c.token_ids, allowed=mask, **dist)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-5, rtol=0)
            # top-p must have removed tokens that top-k kept, or the test would not exercise it.
            top_p_cut |= min(support_sizes(model, prompt, c.token_ids, allowed=mask, **dist)) < 12
    assert top_p_cut


def test_sampled_tokens_follow_the_sampling_distribution(model, tok):
    """Empirical first-token frequencies match exp(sampling log-probs) (total variation < 0.04)."""
    prompt = ids(tok, "2+2=")
    dist = dict(temperature=0.7, top_k=10, top_p=0.9)
    n = 4000
    out = HFEngine(model, tok).generate([prompt], SamplingParams(n=n, max_new_tokens=1, seed=3, **dist))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out[0]]), minlength=len(tok)).double()
    with torch.no_grad():
        logits = model(torch.tensor(prompt)[None]).logits[0, -1]
    probs = sampling_logits(logits, **dist).softmax(-1).double()
    assert counts[probs == 0].sum() == 0  # never outside the support
    assert 0.5 * (counts / n - probs).abs().sum() < 0.04


def test_every_sampled_token_is_allowed(model, tok, prompts):
    allowed = set(ids(tok, "0123456789")) | {tok.eos_token_id}
    out = HFEngine(model, tok).generate(prompts, SamplingParams(n=4, max_new_tokens=12,
                                                                allowed_token_ids=sorted(allowed), seed=1))
    sampled = {t for group in out for c in group for t in c.token_ids}
    assert sampled <= allowed
    assert len(sampled) > 3  # the restriction was exercised on a real spread of tokens


def test_forced_eos_stops_after_one_token(model, tok, prompts):
    out = HFEngine(model, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=8,
                                                                allowed_token_ids=[tok.eos_token_id], seed=0))
    for group in out:
        for c in group:
            assert c.token_ids == [tok.eos_token_id]
            assert c.stopped is True
            assert c.logprobs == [0.0]  # the only allowed token has probability 1


def test_max_new_tokens_without_stop_is_truncated(model, tok, prompts):
    no_stop = list(range(2, len(tok)))  # everything except pad and eos
    out = HFEngine(model, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=7, allowed_token_ids=no_stop,
                                                                seed=0))
    for group in out:
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) == 7
            assert c.stopped is False
            assert tok.eos_token_id not in c.token_ids


def test_custom_stop_token_ends_the_completion_and_is_included(model, tok, prompts):
    a, b = ids(tok, "ab")
    out = HFEngine(model, tok).generate(prompts, SamplingParams(n=6, max_new_tokens=6, allowed_token_ids=[a, b],
                                                                stop_token_ids=[b], temperature=2.0, seed=0))
    completions = [c for group in out for c in group]
    for c in completions:
        if c.stopped:
            assert c.token_ids[-1] == b and b not in c.token_ids[:-1]  # nothing after the first stop
        else:
            assert c.token_ids == [a] * 6
    # Rows finish at different steps, so finished rows really had to stop growing.
    assert any(c.stopped for c in completions) and len({len(c.token_ids) for c in completions}) > 1


def test_same_seed_reproduces_and_different_seeds_differ(model, tok, prompts):
    engine = HFEngine(model, tok)
    params = SamplingParams(n=3, max_new_tokens=10, temperature=1.0, seed=123)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=10, temperature=1.0, seed=124))
    tokens = lambda out: [c.token_ids for group in out for c in group]  # noqa: E731
    assert tokens(first) == tokens(again)
    assert [c.logprobs for g in first for c in g] == [c.logprobs for g in again for c in g]
    assert tokens(first) != tokens(other)
    # No seed: fresh randomness on every call.
    unseeded = SamplingParams(n=3, max_new_tokens=10, temperature=1.0)
    assert tokens(engine.generate(prompts, unseeded)) != tokens(engine.generate(prompts, unseeded))


def test_samples_do_not_depend_on_batching_or_padding(model, tok, prompts):
    """Per-sample generators: a row alone (no padding) samples what it samples in a padded batch."""
    params = SamplingParams(n=2, max_new_tokens=10, temperature=0.7, top_p=0.9, seed=5)
    batched = HFEngine(model, tok, max_batch_size=64).generate(prompts, params)
    one_by_one = HFEngine(model, tok, max_batch_size=1).generate(prompts, params)
    alone = HFEngine(model, tok).generate(prompts[:1], params)
    for group_a, group_b in zip(batched, one_by_one):
        for a, b in zip(group_a, group_b):
            assert a.token_ids == b.token_ids and a.stopped == b.stopped
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    # The first prompt alone samples what it samples as row 0 of the batch.
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in batched[0]]
    # The two samples of a prompt use different streams.
    assert batched[1][0].token_ids != batched[1][1].token_ids


def test_engine_owns_a_frozen_copy_of_the_weights(model, tok, prompts):
    policy = copy.deepcopy(model).train()
    engine = HFEngine(policy, tok)
    params = SamplingParams(n=2, max_new_tokens=6, seed=9)
    before = engine.generate(prompts, params)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)  # a training step on the trainer's model must not reach the engine
    assert ([c.token_ids for g in engine.generate(prompts, params) for c in g]
            == [c.token_ids for g in before for c in g])
    assert not engine.model.training
    assert not any(p.requires_grad for p in engine.model.parameters())
    assert policy.training and all(p.requires_grad for p in policy.parameters())


@pytest.mark.parametrize("autocast", [None, "bfloat16"])
def test_a_weight_sharing_engine_samples_from_the_policy_itself(model, tok, prompts, autocast):
    """share_weights (the synchronous loop): no copy; it samples what a copying engine samples, from
    the policy's current weights, in eval mode, and leaves the policy's mode, gradients and weights as
    they were (a backward pass through the policy still works after it)."""
    policy = copy.deepcopy(model).train()
    engine = HFEngine(policy, tok, share_weights=True, autocast=autocast)
    assert engine.model is policy
    params = SamplingParams(n=2, max_new_tokens=6, seed=9, temperature=0.8)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a training step: reaches the engine at once
    out = engine.generate(prompts, params)
    copying = HFEngine(policy, tok, autocast=autocast).generate(prompts, params)
    assert [[c.token_ids for c in g] for g in out] == [[c.token_ids for c in g] for g in copying]
    # The copy's weights do not require grad, so its kernels may differ (measured 2e-7).
    torch.testing.assert_close(torch.tensor([x for g in out for c in g for x in c.logprobs]),
                               torch.tensor([x for g in copying for c in g for x in c.logprobs]), atol=1e-6, rtol=0)
    assert policy.training and all(p.requires_grad and p.grad is None for p in policy.parameters())
    policy(input_ids=torch.tensor([prompts[0]])).logits.sum().backward()
    engine.update_weights(iter([("lm_head.weight", torch.zeros(1))]), version=4)  # nothing to copy
    assert engine.version == 4


def test_float32_decoding_with_packed_weights_samples_the_same_tokens(tok, prompts, monkeypatch):
    """A Llama wide enough that its layers get packed (``cpu_matmul.packed_linears``) samples the same
    tokens with the same log-probs (to float32 rounding; bit for bit on the AMD EPYC measured) as without
    packing, and its layers are their own again afterwards."""
    monkeypatch.setenv(cpu_matmul.ENV, "onednn")
    cpu_matmul.onednn_chosen.cache_clear()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         initializer_range=0.15, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    wide = cpu_matmul.use_onednn_linears(LlamaForCausalLM(config).eval())
    seen = []
    wide.model.layers[0].mlp.gate_proj.register_forward_pre_hook(lambda m, args: seen.append(type(m).__name__))
    params = SamplingParams(n=3, max_new_tokens=10, temperature=0.7, top_k=12, top_p=0.8, seed=0)
    try:
        packed = HFEngine(wide, tok, max_batch_size=4).generate(prompts, params)
        assert set(seen) == {"_PackedLinear"}
        assert {type(m).__name__ for m in wide.modules() if isinstance(m, torch.nn.Linear)} == {"Float32Linear",
                                                                                              "Linear"}
        monkeypatch.setattr(hf, "packed_linears", lambda model, rows: contextlib.nullcontext())
        plain = HFEngine(wide, tok, max_batch_size=4).generate(prompts, params)
        assert set(seen[-1:]) == {"Float32Linear"}
    finally:
        cpu_matmul.onednn_chosen.cache_clear()
    for prompt, group, same in zip(prompts, packed, plain):
        for c, d in zip(group, same):
            assert c.token_ids == d.token_ids
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(d.logprobs), atol=1e-6, rtol=0)
            # A full forward without the cache sums in another order: a float32 rounding apart at these logits.
            expected = recompute(wide, prompt, c.token_ids, temperature=0.7, top_k=12, top_p=0.8)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_a_weight_sharing_engine_needs_the_models_device_and_dtype(model, tok):
    with pytest.raises(ValueError, match=r"^share_weights needs the model's own device \(cpu\) and dtype, not "
                                         r"device=None and dtype=bfloat16$"):
        HFEngine(model, tok, share_weights=True, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"not device=meta"):
        HFEngine(model, tok, share_weights=True, device="meta")
    HFEngine(model, tok, share_weights=True, device="cpu", dtype="auto")


def test_update_weights_loads_new_policy_and_sets_version(model, tok, prompts):
    engine = HFEngine(model, tok)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in perturbed.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    # A generator, not a dict: the engine must consume the weights as a stream.
    engine.update_weights(((name, p.detach()) for name, p in perturbed.named_parameters()), version=3)
    assert engine.version == 3
    for name, p in perturbed.named_parameters():
        assert torch.equal(dict(engine.model.named_parameters())[name], p)
        assert dict(engine.model.named_parameters())[name].data_ptr() != p.data_ptr()

    dist = dict(temperature=0.7, top_k=12, top_p=0.9)
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=0, **dist))
    differs = False
    for prompt, group in zip(prompts, out):
        for c in group:
            torch.testing.assert_close(torch.tensor(c.logprobs), recompute(perturbed, prompt, c.token_ids, **dist),
                                       atol=1e-5, rtol=0)
            old = recompute(model, prompt, c.token_ids, **dist)
            differs |= not torch.allclose(torch.tensor(c.logprobs), old, atol=1e-3)
    assert differs


def test_update_weights_rejects_unknown_name_and_wrong_shape(model, tok):
    engine = HFEngine(model, tok)
    with pytest.raises(ValueError, match=r"model\.layers\.9\.nope"):
        engine.update_weights([("model.layers.9.nope", torch.zeros(2))], version=1)
    with pytest.raises(ValueError, match=r"lm_head\.weight.*shape"):
        engine.update_weights([("lm_head.weight", torch.zeros(2, 2))], version=1)
    assert engine.version == 0


def test_sleep_and_wake_keep_the_engine_usable(model, tok, prompts):
    engine = HFEngine(model, tok)
    params = SamplingParams(n=1, max_new_tokens=4, seed=2)
    before = engine.generate(prompts, params)
    engine.sleep()
    engine.wake()
    assert engine.generate(prompts, params) == before


def test_invalid_requests_raise(model, tok):
    engine = HFEngine(model, tok)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="allowed_token_ids"):
        engine.generate([[5]], SamplingParams(allowed_token_ids=[len(tok) + 3]))
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(model, tok, max_batch_size=0)


def test_inverse_cdf_hand_values():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 5)
    u = torch.tensor([0.0, 0.2, 0.25, 0.5, 0.9999999])
    # cdf = [0, .25, .25, 1, 1]; pick the first index whose cdf exceeds u: zero-probability tokens never.
    assert _inverse_cdf(probs, u).tolist() == [1, 1, 3, 3, 3]
    assert _inverse_cdf(probs, u, block=2).tolist() == [1, 1, 3, 3, 3]  # blocks [0, .25] [0, .75] [0, pad]


def test_inverse_cdf_equals_a_flat_float64_cumulative_sum_over_a_large_vocabulary():
    """Two-level sums pick what one cumulative sum over the vocabulary picks, zero-probability tokens
    (masked by top-k) never, across block boundaries and a vocabulary that is no multiple of a block."""
    g = torch.Generator().manual_seed(0)
    for V, block in ((49152, 256), (1000, 64), (7, 4)):
        logits = torch.randn(64, V, generator=g) * 4
        logits[:, ::3] = float("-inf")  # a third of the vocabulary has probability 0
        probs = logits.softmax(-1)
        u = torch.rand(64, generator=g)
        u[:4] = torch.tensor([0.0, 1 - 2**-24, 0.5, 1e-9])
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True).squeeze(1)
        picked = _inverse_cdf(probs, u, block=block)
        assert torch.equal(picked, expected), V
        assert bool((probs.gather(1, picked[:, None]) > 0).all())

"""Label-aligned log-probs (and entropies) of tokens under the sampling distribution
(``lit_ppo.models.logprobs``, docs/algorithms.md#data-layout).

Expected log-probs come from the naive path: the model's full ``[B, T, V]`` logits, shifted by hand,
through ``lit_ppo.models.sampling`` (the engines' distribution). Entropies are recomputed in float64.
"""

from __future__ import annotations

import pytest
import torch

from lit_ppo.models import token_logprobs
from lit_ppo.models.logprobs import _label_positions, _SampledTokenLogprobs
from lit_ppo.models.sampling import allowed_mask, sampling_logits, sampling_logprobs


def _naive_logprobs(model, input_ids, mask, **params):
    """logp[b, t] from the full logits at t-1; 0 at t = 0 and wherever token t or t-1 is padding."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=mask.long()).logits
    expected = torch.zeros(input_ids.shape)
    expected[:, 1:] = sampling_logprobs(logits[:, :-1], input_ids[:, 1:], **params)
    valid = torch.zeros_like(mask)
    valid[:, 1:] = mask[:, 1:] & mask[:, :-1]
    return torch.where(valid, expected, torch.zeros(())), logits, valid


SAMPLING_CASES = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.8),
    "all": dict(temperature=0.7, top_k=7, top_p=0.9),
}


@pytest.mark.parametrize("params", SAMPLING_CASES.values(), ids=SAMPLING_CASES.keys())
def test_token_logprobs_match_full_logits(tiny, batch, params):
    model, _ = tiny
    input_ids, mask = batch
    expected, _, valid = _naive_logprobs(model, input_ids, mask, **params)
    logp, entropy = token_logprobs(model, input_ids, mask, chunk_size=4, **params)
    assert entropy is None and logp.dtype == torch.float32 and logp.shape == input_ids.shape
    torch.testing.assert_close(logp.detach(), expected, rtol=1e-5, atol=1e-5)
    assert (logp[~valid] == 0).all() and (logp[:, 0] == 0).all()
    if params.get("top_k") or params.get("top_p"):
        assert torch.isinf(expected[valid]).any()  # some labels really lie outside the support


def test_token_logprobs_allowed_restriction_and_loss_mask(tiny, batch):
    model, tok = tiny
    input_ids, mask = batch
    allowed = allowed_mask(tok.convert_tokens_to_ids(list("0123456789")) + [tok.eos_token_id], len(tok), "cpu")
    expected, _, valid = _naive_logprobs(model, input_ids, mask, allowed=allowed, temperature=0.7)
    logp, _ = token_logprobs(model, input_ids, mask, allowed=allowed, temperature=0.7)
    torch.testing.assert_close(logp.detach(), expected, rtol=1e-5, atol=1e-5)
    is_allowed = allowed[input_ids]
    assert torch.isinf(logp[valid & ~is_allowed]).all() and torch.isfinite(logp[valid & is_allowed]).all()
    # loss_mask: only the generated (allowed) tokens get log-probs, the prompt is 0, not -inf
    loss_mask = valid & is_allowed
    masked, _ = token_logprobs(model, input_ids, mask, allowed=allowed, temperature=0.7, loss_mask=loss_mask)
    torch.testing.assert_close(masked.detach(), torch.where(loss_mask, expected, torch.zeros(())), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(masked).all()


def _gpt2(vocab_size: int):
    """A random one-layer GPT-2: absolute position embeddings, base model ``transformer``, tied head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()


def test_token_logprobs_left_padding_matches_right_padding(tiny):
    """Positions count real tokens. GPT-2's absolute positions make this observable (RoPE is shift-invariant)."""
    _, tok = tiny
    model = _gpt2(len(tok))
    texts = ["<|user|>1+2=<|assistant|>3", "<|user|>9=<|assistant|>"]
    enc_r = tok(texts, padding=True, padding_side="right", return_tensors="pt")
    enc_l = tok(texts, padding=True, padding_side="left", return_tensors="pt")
    right, _ = token_logprobs(model, enc_r["input_ids"], enc_r["attention_mask"])
    left, _ = token_logprobs(model, enc_l["input_ids"], enc_l["attention_mask"])
    n = int(enc_r["attention_mask"][1].sum())  # row 1 is shorter by 2
    torch.testing.assert_close(left[1, -n:], right[1, :n], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(left[0], right[0])
    assert (left[1, : left.shape[1] - n + 1] == 0).all()  # padding and the first real token


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.7, top_k=7, top_p=0.9)], ids=["plain", "all"])
def test_chunk_sizes_give_identical_values_and_gradients(tiny, batch, params):
    model, _ = tiny
    input_ids, mask = batch
    weights = torch.randn(input_ids.shape, generator=torch.Generator().manual_seed(0))
    results = []
    for chunk_size in (1, 3, 10_000):
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, input_ids, mask, chunk_size=chunk_size, with_entropy=True, **params)
        finite = torch.where(torch.isfinite(logp), logp, torch.zeros(()))
        ((finite * weights).sum() + 0.1 * entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((logp.detach(), entropy.detach(), grads))
    model.zero_grad(set_to_none=True)
    logp0, ent0, grads0 = results[0]
    assert grads0["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0  # grads reach the body
    assert grads0["lm_head.weight"].abs().sum() > 0
    for logp, ent, grads in results[1:]:
        torch.testing.assert_close(logp, logp0, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ent, ent0, rtol=1e-6, atol=1e-6)
        for name, g in grads.items():
            torch.testing.assert_close(g, grads0[name], rtol=1e-5, atol=1e-5, msg=name)  # summation order
    with torch.no_grad():
        no_grad, _ = token_logprobs(model, input_ids, mask, chunk_size=2, **params)
    torch.testing.assert_close(no_grad, logp0, rtol=1e-6, atol=1e-6)


def test_body_gradient_checkpointing_gives_the_same_gradients(tiny, batch):
    """LitPPO may enable HF gradient checkpointing on the policy; token_logprobs calls its body directly."""
    import copy

    model = copy.deepcopy(tiny[0]).train()
    grads = []
    for checkpointed in (False, True):
        if checkpointed:
            model.gradient_checkpointing_enable()
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, *batch, chunk_size=4)
        logp.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-6)


def test_chunks_are_recomputed_not_stored(tiny, batch):
    """With grad enabled, autograd must not save any ``[*, V]`` tensor: chunks are checkpointed."""
    model, tok = tiny
    input_ids, mask = batch
    V = len(tok)
    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, entropy = token_logprobs(model, input_ids, mask, chunk_size=4, with_entropy=True, top_p=0.9)
    assert saved_shapes and not [s for s in saved_shapes if s and s[-1] == V]
    # control: the plain forward does save vocabulary-sized tensors, so the check can fail
    saved_shapes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sampling_logits(model(input_ids=input_ids).logits, top_p=0.9).log_softmax(-1)
    assert [s for s in saved_shapes if s and s[-1] == V]


def test_entropy_matches_hand_computation(tiny, batch):
    model, tok = tiny
    input_ids, mask = batch
    allowed = allowed_mask(list(range(6, 40)), len(tok), "cpu")
    for params in (dict(), dict(temperature=0.7, top_k=3, allowed=allowed), dict(top_p=0.5), dict(top_k=1)):
        _, logits, valid = _naive_logprobs(model, input_ids, mask, **params)
        z = sampling_logits(logits[:, :-1], **params).double()
        expected = torch.zeros(input_ids.shape, dtype=torch.float64)
        for b, t in valid.nonzero().tolist():
            support = torch.isfinite(z[b, t - 1])
            p = torch.softmax(z[b, t - 1][support], -1)
            expected[b, t] = -(p * p.log()).sum()
        logp, entropy = token_logprobs(model, input_ids, mask, with_entropy=True, chunk_size=5, **params)
        assert torch.isfinite(entropy).all()
        torch.testing.assert_close(entropy.detach().double(), expected, rtol=1e-5, atol=1e-5)
        entropy.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        model.zero_grad(set_to_none=True)
    assert (entropy == 0).all()  # top_k=1: a point mass


def _head_logprobs(h, weight, bias, labels, params):
    """The naive head: ``[N, V]`` float32 log-softmax of the sampling logits, through autograd."""
    logp_all = sampling_logits(torch.nn.functional.linear(h, weight, bias), **params).log_softmax(-1)
    finite = torch.where(torch.isfinite(logp_all), logp_all, torch.zeros(()))
    return logp_all.gather(-1, labels[:, None]).squeeze(-1), -(logp_all.exp() * finite).sum(-1)


HEAD_CASES = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "top_k_top_p": dict(temperature=1.3, top_k=7, top_p=0.8),
    "allowed": dict(temperature=0.7, allowed=torch.arange(50) % 3 != 0),
}


@pytest.mark.parametrize("loss", ["logp", "entropy", "both"])
@pytest.mark.parametrize("params", HEAD_CASES.values(), ids=HEAD_CASES.keys())
def test_recomputed_head_gradients_equal_the_full_logits_gradients(params, loss):
    """The backward pass recomputes each chunk's logits and applies d log p_y / dz = onehot - p and
    dH / dz = -p (log p + H) by hand: values and gradients of hidden states, weight and bias equal
    autograd through the full logits. Labels include tokens outside the support (log-prob -inf)."""
    params = dict(dict(temperature=1.0, top_k=0, top_p=1.0, allowed=None), **params)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=g)
    w_logp, w_ent = torch.randn(37, generator=g), torch.randn(37, generator=g)
    results = []
    for compute in (_head_logprobs, lambda *a: _SampledTokenLogprobs.apply(*a, 8, loss != "logp")):
        h.grad = weight.grad = bias.grad = None
        logp, entropy = compute(h, weight, bias, labels, params)
        finite = torch.isfinite(logp)
        total = (torch.where(finite, logp, torch.zeros(())) * w_logp).sum() if loss != "entropy" else 0
        if loss != "logp":
            total = total + (entropy * w_ent).sum()
        total.backward()
        results.append([logp.detach(), entropy.detach(), h.grad, weight.grad, bias.grad])
    if params["top_k"] or params["allowed"] is not None:
        assert (~torch.isfinite(results[0][0])).any()  # some labels really lie outside the support
    (naive_logp, naive_ent, *naive_grads), (logp, ent, *grads) = results
    torch.testing.assert_close(logp, naive_logp, rtol=1e-5, atol=1e-5)
    if loss != "logp":
        torch.testing.assert_close(ent, naive_ent, rtol=1e-5, atol=1e-5)
    for name, got, expected in zip(("hidden", "weight", "bias"), grads, naive_grads):
        assert expected.abs().sum() > 0
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)


def _aten_ops(fn) -> list[str]:
    """The aten operators ``fn()`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Log() as log:
        fn()
    return log.ops


def test_the_entropy_gets_no_gradient_work_unless_the_loss_uses_it(tiny, batch):
    """At entropy_coef 0 the entropy is only logged: the backward pass runs exactly the operators of a
    pass that never computed it (and so the same gradients)."""
    model, _ = tiny
    backward_ops, grads = [], []
    for with_entropy in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = token_logprobs(model, *batch, chunk_size=4, with_entropy=with_entropy)
        if with_entropy:
            entropy.sum().item()  # used for a metric, outside the graph
        backward_ops.append(_aten_ops(lambda: logp.sum().backward()))
        grads.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    assert backward_ops[0] == backward_ops[1]
    for without, with_ in zip(*grads):
        torch.testing.assert_close(with_, without, rtol=0, atol=0)


def test_no_tensor_of_all_positions_by_vocabulary_is_ever_allocated(tiny, batch):
    """Forward and backward allocate at most ``chunk_size`` x V logits at a time (the naive path's
    ``[positions, V]`` tensors are the control)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, tok = tiny
    V = len(tok)

    class LargestOutput(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view:  # no allocation (e.g. the weight's transpose)
                return out
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == V:
                    LargestOutput.largest = max(LargestOutput.largest, t.numel() // V)
            return out

    labelled = int(_label_positions(batch[1]).sum())
    assert labelled > 8
    with LargestOutput():
        logp, entropy = token_logprobs(model, *batch, chunk_size=4, with_entropy=True)
        (logp.sum() + entropy.sum()).backward()
    assert LargestOutput.largest == 4  # rows of a chunk
    model.zero_grad(set_to_none=True)
    LargestOutput.largest = 0
    with LargestOutput():
        _head_logprobs(torch.randn(labelled, model.config.hidden_size), model.lm_head.weight, None,
                       torch.zeros(labelled, dtype=torch.long), dict())[0].sum().backward()
    assert LargestOutput.largest == labelled
    model.zero_grad(set_to_none=True)


def test_bf16_autocast_head_matches_the_autocast_naive_path():
    """Under bf16 autocast the head's matmuls run in bf16 as the layer would, the log-softmax in float32:
    values equal the naive path under the same autocast; gradients stay float32 (master weights)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(40, 32, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(64, 32, generator=g)).requires_grad_()
    labels = torch.randint(0, 64, (40,), generator=g)
    params = dict(temperature=0.9, top_k=0, top_p=1.0, allowed=None)
    results = []
    for compute in (_head_logprobs, lambda *a: _SampledTokenLogprobs.apply(*a, 16, True)):
        h.grad = weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, entropy = compute(h, weight, None, labels, params)
        (logp.sum() + entropy.sum()).backward()
        results.append([logp.detach(), entropy.detach(), h.grad, weight.grad])
    for got, expected in zip(*results[::-1]):
        assert got.dtype == torch.float32
        # Both round the same bf16 matmul; the gradient matmuls round in bf16 (relative 2^-8).
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_token_logprobs_other_architecture():
    """GPT-2 (base model ``transformer``, tied head): same result as its full logits."""
    model = _gpt2(50)
    input_ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    expected, _, _ = _naive_logprobs(model, input_ids, mask, temperature=0.9, top_k=10)
    logp, _ = token_logprobs(model, input_ids, mask, temperature=0.9, top_k=10, chunk_size=3)
    torch.testing.assert_close(logp.detach(), expected, rtol=1e-5, atol=1e-5)

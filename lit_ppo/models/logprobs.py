"""Label-aligned log-probs (and entropies) of tokens under the sampling distribution
(docs/algorithms.md#data-layout), the LM head and the log-softmax computed in chunks by a custom
autograd function."""

from __future__ import annotations

import torch

from lit_ppo.models import cpu_matmul
from lit_ppo.models.packing import hidden_states
from lit_ppo.models.sampling import sampling_logits


def _hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of a transformer body (a causal LM's ``base_model``), aligned
    with the padded batch (its values at padding are unused). The body runs on the rows' real tokens
    packed into bins, position ids restarting per row, where it supports that (``lit_ppo.models.packing``):
    no pad token is computed. Positions count real tokens either way, as the engines' generate does."""
    return hidden_states(body, input_ids, mask)


def _label_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: token t is real and has a real predecessor (so it has a log-prob / a value)."""
    mask = attention_mask.bool()
    has = torch.zeros_like(mask)
    has[:, 1:] = mask[:, 1:] & mask[:, :-1]
    return has


class _SampledTokenLogprobs(torch.autograd.Function):
    """log p(label) and entropy ``-sum p log p`` of the sampling distribution of ``head(h)``, computed
    ``chunk_size`` rows at a time. Only the rows' log-sum-exp and entropy are kept for the backward
    pass, which recomputes each chunk's logits: no ``[rows, vocab]`` tensor outlives its chunk.

    With z the sampling logits (``sampling_logits`` of ``h @ W.T + b``: z = raw / T inside the support,
    -inf outside), p = softmax(z) and y the label:
    d log p_y / d z = onehot(y) - p,  d H / d z = -p (log p + H),  d z / d raw = 1 / T in the support.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, labels, params: dict, chunk_size: int, with_entropy: bool):
        ctx.set_materialize_grads(False)  # an unused output (the entropy at entropy_coef 0) gets no gradient
        # The head's matmul runs in autocast's dtype when it is on (as the layer itself would), else the
        # weights'; the log-softmax in float32 (sampling_logits).
        device = weight.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        logp = h.new_empty(h.shape[0], dtype=torch.float32)
        lse = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            z = sampling_logits(cpu_matmul.linear(h[rows].to(dtype), w, b), **params)
            lse[rows] = z.logsumexp(-1)
            logp[rows] = z.gather(-1, labels[rows, None]).squeeze(-1) - lse[rows]
            if with_entropy:
                logp_all = z.sub_(lse[rows, None])
                p = logp_all.exp()
                # Outside the support p = 0 and log p = -inf: count 0, not 0 * -inf.
                entropy[rows] = -p.mul_(logp_all.nan_to_num_(neginf=0.0)).sum(-1)
        ctx.save_for_backward(h, weight, bias, labels, lse, logp, entropy)
        ctx.params, ctx.chunk_size, ctx.dtype = params, chunk_size, dtype
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        h, weight, bias, labels, lse, logp, entropy = ctx.saved_tensors
        need_h, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature = ctx.params["temperature"]
        if (grad_logp is None and grad_entropy is None) or temperature == 0:  # greedy: z does not depend on h
            return None, None, None, None, None, None, None
        dtype = ctx.dtype
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        # A label outside the support has log-prob -inf and no gradient.
        grad_label = None if grad_logp is None else grad_logp * torch.isfinite(logp)
        for start in range(0, h.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            h_c = h[rows].to(dtype)
            logp_all = sampling_logits(cpu_matmul.linear(h_c, w, b), **ctx.params).sub_(lse[rows, None])
            if grad_entropy is None:  # -p g_logp
                grad_z = logp_all.exp_().mul_(-grad_logp[rows, None])
            else:  # -p (g_logp + g_H (log p + H)); log p = -inf only where p = 0
                p = logp_all.exp()
                coef = logp_all.nan_to_num_(neginf=0.0).add_(entropy[rows, None]).mul_(grad_entropy[rows, None])
                if grad_logp is not None:
                    coef.add_(grad_logp[rows, None])
                grad_z = p.mul_(coef).neg_()
            if grad_label is not None:
                grad_z.scatter_add_(-1, labels[rows, None], grad_label[rows, None])
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(dtype)
            if need_h:
                grad_h[rows] = cpu_matmul.matmul(grad_z, w).to(h.dtype)
            if need_weight:
                if dtype == torch.float32:  # in place: MKL's product beats oneDNN's and a sum (cpu_matmul)
                    grad_weight.addmm_(grad_z.t(), h_c)
                else:  # a lower-precision product, accumulated in float32
                    grad_weight += grad_z.t() @ h_c
            if need_bias:
                grad_bias += grad_z.sum(0)
        return (grad_h, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                   top_k: int = 0, top_p: float = 1.0, allowed: torch.Tensor | None = None,
                   loss_mask: torch.Tensor | None = None, chunk_size: int = 128, with_entropy: bool = False):
    """Label-aligned log-probs (and entropies) of ``input_ids`` under the sampling distribution.

    Returns ``(logp, entropy)``, float32 ``[B, T]``: ``logp[b, t] = log p(input_ids[b, t] | tokens < t)``
    where p is ``lit_ppo.models.sampling.sampling_logits`` (temperature, top-k, top-p, ``allowed`` bool ``[V]``
    mask) of the logits at position t-1, exactly what the engines report; ``entropy[b, t]`` is
    ``-sum p log p`` of that distribution (None unless ``with_entropy``). Both are 0 at t = 0, at
    padding and, if ``loss_mask`` (``[B, T]`` bool) is given, wherever it is False: pass it to skip the
    prompt, whose tokens may lie outside the top-k / top-p / allowed support (log-prob -inf).

    Memory: the body runs once; the LM head and the float32 log-softmax run on ``chunk_size``
    positions at a time, and the backward pass recomputes each chunk's logits, so neither holds
    ``[B, T, V]`` logits. The entropy gets a gradient only if the loss uses it. Logits are
    ``model.get_output_embeddings()`` (a linear layer) of ``model.base_model``'s last hidden state
    (Llama, Qwen, Mistral, GPT-2, ...); models that post-process logits (soft-capping) are refused.
    """
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("token_logprobs does not support models with final_logit_softcapping")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} is invalid: must be >= 1")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"token_logprobs needs a linear output embedding, this model has {type(head).__name__}")
    positions = _label_positions(attention_mask)
    if loss_mask is not None:
        positions &= loss_mask.bool()
    hidden = _hidden_states(model.base_model, input_ids, attention_mask.bool())
    # Only the labelled positions get logits: row b, label t is predicted from hidden[b, t - 1].
    rows, cols = positions.nonzero(as_tuple=True)
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, allowed=allowed)
    logp, entropy = _SampledTokenLogprobs.apply(hidden[rows, cols - 1], head.weight, head.bias,
                                                input_ids[rows, cols], params, chunk_size, with_entropy)
    zeros = hidden.new_zeros(positions.shape, dtype=torch.float32)
    return (zeros.index_put((rows, cols), logp),
            zeros.index_put((rows, cols), entropy) if with_entropy else None)

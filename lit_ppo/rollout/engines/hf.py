"""HFEngine: a rollout engine on a plain transformers causal LM (CPU and GPU, always available).

The engine keeps its own copy of the policy weights, so sampling never touches the trainer's
parameters (or, in the synchronous loop, where sampling and training take turns, samples from the
policy itself: ``share_weights``). It decodes a batch of left-padded prompts step by step with the
model's KV cache, prefilling each prompt once for all its samples and dropping every sequence from
the batch as soon as it stops.
Each step samples from ``lit_ppo.models.sampling.sampling_logits`` (allowed tokens, temperature, top-k,
top-p) and records the log-prob of the sampled token under exactly that distribution: the
trainer's recompute with ``sampling_logprobs`` gives the same number.

Precision: the engine computes in its copy's dtype (``dtype``, default the policy's) and, with
``autocast``, under ``torch.autocast`` as Lightning's ``trainer.precision=bf16-mixed`` runs the
trainer; the sampling log-softmax is float32 either way. On CPU the linear layers decode with their
weights packed once per call for oneDNN (``lit_ppo.models.cpu_matmul.packed_linears``): the same products
to the last rounding, in less time.

Randomness is per sample: sample ``j`` of prompt ``i`` draws its uniforms from a generator seeded
with a hash of ``(seed, i, j)``. A completion therefore depends only on its prompt, its index and
the seed, not on which other rows share its batch, how much padding they add or ``max_batch_size``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import secrets
from typing import Iterable

import torch

from lit_ppo.config.rollout import precision_problem
from lit_ppo.models import torch_dtype
from lit_ppo.models.cpu_matmul import packed_linears
from lit_ppo.models.sampling import allowed_mask, sampling_logits
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams


class HFEngine:
    """Batched KV-cache sampling on a transformers ``*ForCausalLM`` (implements ``RolloutEngine``).

    Args:
        model: the policy; deep-copied at construction (eval mode), so later training steps do not
            change the engine until ``update_weights``.
        tokenizer: provides ``eos_token_id`` (always a stop token) and ``pad_token_id``.
        device: where the engine's copy lives; None keeps the model's device.
        max_batch_size: most sequences decoded together; more rows are decoded in chunks.
        dtype: weight dtype of the engine's copy, 'float32', 'bfloat16' or 'float16' (as vLLM's
            ``dtype``: ``rollout.engine_kwargs.dtype``); None or 'auto' keeps the policy's. Pushed
            weights are cast to it. A lower precision than the trainer's widens the behaviour /
            trainer log-prob gap (docs/rollout.md#the-log-prob-gap).
        autocast: 'bfloat16' or 'float16' runs every forward pass under ``torch.autocast`` of that
            dtype on the engine's device, as Lightning's ``trainer.precision=bf16-mixed`` /
            ``16-mixed`` runs the trainer's (the data module passes the trainer's): the engine then
            computes exactly what the trainer recomputes, also on a producer thread, which does not
            inherit the trainer's autocast (thread-local). None: whatever autocast the caller has.
            The sampling log-softmax is float32 either way (``sampling_logits``).
        share_weights: sample from ``model`` itself, not a copy, for the synchronous loop, where
            sampling and training take turns: no second copy of the weights, and ``update_weights``
            only records the version. The model is in eval mode during each call and returns to its
            mode after it. Needs ``device`` and ``dtype`` left as the model's.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, device: torch.device | str | None = None,
                 max_batch_size: int = 256, dtype: str | None = None, autocast: str | None = None,
                 share_weights: bool = False):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} is invalid: must be >= 1")
        problem = precision_problem(dtype, autocast)
        if problem:
            raise ValueError(problem)
        self.autocast = None if autocast is None else torch_dtype(autocast)
        self.shares_weights = share_weights
        if share_weights:
            own = next(model.parameters()).device
            if (device is not None and torch.device(device) != own) or dtype not in (None, "auto"):
                raise ValueError(f"share_weights needs the model's own device ({own}) and dtype, "
                                 f"not device={device} and dtype={dtype}")
            self.model = model
        else:
            self.model = copy.deepcopy(model)
            if device is not None:
                self.model.to(device)
            if dtype not in (None, "auto"):
                self.model.to(torch_dtype(dtype))
            self.model.eval().requires_grad_(self.autocast is not None)  # see generate
        self.device = next(self.model.parameters()).device
        self.max_batch_size = max_batch_size
        self.eos_token_id = tokenizer.eos_token_id
        # The pad id only fills left padding that the attention mask hides; any valid id works.
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Tied weights appear under every alias (e.g. lm_head.weight and embed_tokens.weight), so the
        # trainer may push either name.
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self.version = 0

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order (see the module docstring)."""
        # Autocast casts each weight once per call instead of once per decoding step: its cache holds
        # the casts of leaf tensors that require grad (hence the engine's own weights do) outside
        # inference mode, and is cleared on the way out, since the weights may change before the next
        # call. Tensors made in inference mode could not enter the shared policy's next backward pass.
        no_grad = torch.no_grad() if self.autocast is not None or self.shares_weights else torch.inference_mode()
        autocast = (torch.autocast(self.device.type, dtype=self.autocast, cache_enabled=True)
                    if self.autocast is not None else contextlib.nullcontext())
        training = self.model.training
        self.model.eval()
        rows = max(1, min(len(prompts) * params.n, self.max_batch_size))
        try:
            with no_grad, autocast, packed_linears(self.model, rows):
                return self._generate(prompts, params)
        finally:
            self.model.train(training)
            if self.autocast is not None:
                torch.clear_autocast_cache()

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"n={params.n} and max_new_tokens={params.max_new_tokens} must be >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        stop_ids = set(params.stop_token_ids)
        if self.eos_token_id is not None:
            stop_ids.add(self.eos_token_id)
        stop = torch.tensor(sorted(stop_ids), dtype=torch.long, device=self.device)
        allowed = allowed_mask(params.allowed_token_ids, self.model.config.vocab_size, self.device)
        seed = params.seed if params.seed is not None else secrets.randbits(63)

        rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        out: list[list[Completion]] = [[] for _ in prompts]
        for start in range(0, len(rows), self.max_batch_size):
            chunk = rows[start:start + self.max_batch_size]
            completions = self._decode([prompts[i] for i, _ in chunk],
                                       [_sample_seed(seed, i, j) for i, j in chunk], params, stop, allowed)
            for (i, _), completion in zip(chunk, completions):
                out[i].append(completion)  # rows are in (prompt, sample) order
        return out

    def _decode(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams,
                stop: torch.Tensor, allowed: torch.Tensor | None) -> list[Completion]:
        """Sample one completion per row of ``prompts`` (one decoding batch).

        Rows of one prompt are adjacent: each distinct prompt is prefilled once and its KV cache is
        shared by its rows. A row that stops leaves the batch (and the cache) at once, so the work
        per step follows the sequences still running.
        """
        B, steps = len(prompts), params.max_new_tokens
        starts = [r == 0 or prompts[r] != prompts[r - 1] for r in range(B)]
        distinct = [r for r in range(B) if starts[r]]
        source = (torch.tensor(starts).cumsum(0) - 1).to(self.device)  # row -> its distinct prompt
        width = max(len(prompts[r]) for r in distinct)
        input_ids = torch.full((len(distinct), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for u, r in enumerate(distinct):
            input_ids[u, width - len(prompts[r]):] = torch.tensor(prompts[r], dtype=torch.long)
            attention_mask[u, width - len(prompts[r]):] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # Left padding must not shift positions: each row counts from its first real token.
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        # All uniforms of a row come from its own CPU generator, so the row's samples do not depend
        # on the batch around it or on the device.
        uniforms = torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s)) for s in seeds])
        uniforms = uniforms.to(self.device)

        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_select_indices(source)
        logits, attention_mask, positions = out.logits[source, -1], attention_mask[source], position_ids[source, -1:]
        tokens = torch.zeros((B, steps), dtype=torch.long, device=self.device)
        logprobs = torch.zeros((B, steps), dtype=torch.float32, device=self.device)
        lengths = torch.full((B,), steps, dtype=torch.long, device=self.device)
        stopped = torch.zeros(B, dtype=torch.bool, device=self.device)
        live = torch.arange(B, device=self.device)  # the batch rows still decoding, in cache order
        for t in range(steps):
            logp = sampling_logits(logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                   allowed=allowed).log_softmax(-1)
            token = _inverse_cdf(logp.exp(), uniforms[live, t])
            tokens[live, t] = token
            logprobs[live, t] = logp.gather(1, token[:, None]).squeeze(1)
            done = torch.isin(token, stop)
            lengths[live[done]] = t + 1
            stopped[live[done]] = True
            running = ~done
            if t + 1 == steps or not bool(running.any()):
                break
            if not bool(running.all()):
                keep = running.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                live, token, attention_mask, positions = (x[keep] for x in (live, token, attention_mask, positions))
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], 1)
            positions = positions + 1
            logits = self.model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=positions,
                                past_key_values=cache, use_cache=True).logits[:, -1]

        tokens, logprobs, lengths, stopped = tokens.cpu(), logprobs.cpu(), lengths.tolist(), stopped.tolist()
        return [Completion(token_ids=tokens[r, :lengths[r]].tolist(), logprobs=logprobs[r, :lengths[r]].tolist(),
                           stopped=stopped[r], version=self.version) for r in range(B)]

    # ------------------------------------------------------------------ weights and memory
    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy each ``(name, tensor)`` in place into the engine's parameter of that name.

        Tensors are consumed one at a time (a generator is fine), so no second full set of weights
        is ever held; ``copy_`` casts dtype and moves device as needed. An engine that shares the
        trainer's weights already has them: it records the version only.
        """
        if self.shares_weights:
            self.version = version
            return
        for name, tensor in weights:
            param = self._params.get(name)
            if param is None:
                raise ValueError(f"update_weights: the engine's model has no parameter named {name!r}")
            if param.shape != tensor.shape:
                raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                 f"the engine's parameter has {tuple(param.shape)}")
            param.copy_(tensor)
        self.version = version

    def sleep(self) -> None:
        """No-op: the KV cache lives only inside ``generate``, and the weights are needed next time."""

    def wake(self) -> None:
        """No-op (see ``sleep``)."""


def _sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one sample; hashing keeps streams of different (seed, i, j) unrelated."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Token ``[B]`` drawn from ``probs`` ``[B, V]`` with one uniform ``u`` ``[B]`` in [0, 1) per row.

    Picks the first token whose cumulative probability exceeds ``u`` times the total. A token with
    probability 0 never has a strictly larger cumulative sum than the token before it, so it can
    never be picked; float64 keeps the sums monotone and precise over large vocabularies. The sums
    run in two levels, over blocks of ``block`` tokens and then within the one block each row lands
    in (a cumulative sum over the whole vocabulary took 8 ms per step for 16 x 49152, this 1 ms).
    """
    B, V = probs.shape
    p = torch.nn.functional.pad(probs, (0, -V % block)).double().view(B, -1, block)
    cum_blocks = p.sum(-1).cumsum(-1)
    target = u.double() * cum_blocks[:, -1]
    k = torch.searchsorted(cum_blocks, target[:, None], right=True).squeeze(1).clamp_(max=cum_blocks.shape[1] - 1)
    before = torch.where(k > 0, cum_blocks.gather(1, (k - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    in_block = p[torch.arange(B, device=p.device), k]
    j = torch.searchsorted(in_block.cumsum(-1), (target - before)[:, None], right=True).squeeze(1)
    # Where rounding puts the target at or past the block's own total, its last possible token.
    last_possible = (in_block > 0).long().mul_(torch.arange(block, device=p.device)).amax(-1)
    return (k * block + torch.minimum(j, last_possible)).clamp_(max=V - 1)

"""Sequence packing of the trainer's forward passes: the real tokens of a padded batch, and no pad.

A rollout batch is ``[B, T]`` with padding (left-padded prompts, right-padded responses). Its forwards
(the training forward and the no-grad old-log-prob / reference / critic passes) run on a packed
batch instead: the rows' real tokens are packed first-fit-decreasing into bins as long as the
longest row (``first_fit_decreasing``), giving ``[n_bins, L]`` with position ids restarting at 0
for each row, and no attention mask. transformers reads such position ids as packed sequences and
masks attention block-diagonally (``masking_utils.find_packed_sequence_indices``; flash-attention
kernels take them as varlen boundaries). The hidden states are scattered back to ``[B, T, H]``.

Bins no longer than the longest row keep attention per bin within today's padded row, which
matters on CPU and with sdpa / eager attention, where a packed row costs ``O(L^2)`` attention
whatever its sequences; padding is reduced to the bins' leftover, and rows to the number of bins.
A batch without padding runs as it is (each row is a bin already). Measured on 2 CPU cores with
SmolLM2-135M, 16 rows of 20-40 prompt and 5-64 response tokens: forward + backward and no-grad
forward in 0.8x the padded time (sdpa and eager); without padding, the same time.

Values equal the padded forward's up to float32 rounding (a sequence's offset in its bin changes
how sdpa blocks its softmax, as a different left padding does). Whether a model honours packed
position ids is probed once per body and attention implementation (``packing_supported``): one
that does not (ALiBi models such as Bloom, OPT, custom attention, ...) keeps the padded forward.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch


def first_fit_decreasing(lengths: Sequence[int], capacity: int | None = None) -> list[list[int]]:
    """Row indices packed into bins of ``capacity`` tokens (default: the longest length).

    Rows are placed longest first (ties by index) into the first bin with room for them, so every
    row of length > 0 is in exactly one bin, each bin's total is at most ``capacity``; rows of
    length 0 are in none. A row longer than ``capacity`` is a ValueError."""
    if capacity is None:
        capacity = max(lengths, default=0)
    bins: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[row]
        if length < 0 or length > capacity:
            raise ValueError(f"row {row} has length {length}: must be in [0, capacity={capacity}]")
        if length == 0:
            continue
        for b, load in enumerate(loads):
            if load + length <= capacity:
                bins[b].append(row)
                loads[b] += length
                break
        else:
            bins.append([row])
            loads.append(length)
    return bins


@dataclass(frozen=True)
class Packing:
    """Where each real token of a padded ``[B, T]`` batch goes in its packed ``[n_bins, width]`` batch.

    The ``N`` real tokens, in row-major order: token ``i`` is ``(rows[i], cols[i])`` of the padded
    batch and ``(bins[i], slots[i])`` of the packed one, with position id ``positions[i]`` (its index
    among its row's real tokens, as the padded forward counts them)."""

    rows: torch.Tensor
    cols: torch.Tensor
    bins: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    n_bins: int
    width: int

    def pack(self, input_ids: torch.Tensor, fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed input ids, position ids)``, both ``[n_bins, width]``. A bin's leftover holds
        ``fill`` tokens at position 0: each one a sequence of its own, attending only to itself."""
        ids = input_ids.new_full((self.n_bins, self.width), fill)
        ids[self.bins, self.slots] = input_ids[self.rows, self.cols]
        position_ids = torch.zeros_like(ids)
        position_ids[self.bins, self.slots] = self.positions
        return ids, position_ids

    def unpack(self, packed: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """``[n_bins, width, ...]`` outputs back to ``[B, T, ...]`` (``shape = (B, T)``), zero at padding;
        differentiable."""
        out = packed.new_zeros((*shape, *packed.shape[2:]))
        return out.index_put((self.rows, self.cols), packed[self.bins, self.slots])


def plan_packing(mask: torch.Tensor, capacity: int | None = None) -> Packing:
    """The ``Packing`` of the real tokens (``mask`` True, ``[B, T]``) into first-fit-decreasing bins of
    ``capacity`` tokens (default: the longest row's real length); a row's real tokens stay in order and
    together. A mask with holes packs like its real tokens side by side, as the padded forward sees them."""
    mask = mask.bool()
    lengths = mask.sum(-1).tolist()
    capacity = max(lengths, default=0) if capacity is None else capacity
    row_bin, row_start = [0] * len(lengths), [0] * len(lengths)
    bins = first_fit_decreasing(lengths, capacity)
    for b, members in enumerate(bins):
        start = 0
        for row in members:
            row_bin[row], row_start[row] = b, start
            start += lengths[row]
    rows, cols = mask.nonzero(as_tuple=True)
    positions = (mask.long().cumsum(-1) - 1)[rows, cols]
    device = mask.device
    token_bins = torch.tensor(row_bin, device=device, dtype=torch.long)[rows]
    slots = torch.tensor(row_start, device=device, dtype=torch.long)[rows] + positions
    return Packing(rows, cols, token_bins, slots, positions, len(bins), capacity)


def padded_hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of ``body`` run on the padded batch itself."""
    # Positions count real tokens, as the engines' generate does, so left-padded rows work too.
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return body(input_ids=input_ids, attention_mask=mask.long(), position_ids=position_ids,
                use_cache=False).last_hidden_state


def packed_hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor,
                         capacity: int | None = None) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of ``body`` run on the packed real tokens of the batch
    (``plan_packing``), zero at padding. The body must honour packed position ids
    (``packing_supported``); a batch without real tokens runs padded."""
    mask = mask.bool()
    if capacity is None and bool(mask.all()):  # no padding: each row is a bin of its own already
        position_ids = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0).expand(mask.shape[0], -1)
        return body(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                    use_cache=False).last_hidden_state
    plan = plan_packing(mask, capacity)
    if plan.n_bins == 0:
        return padded_hidden_states(body, input_ids, mask)  # still one body call, as every FSDP rank needs
    ids, position_ids = plan.pack(input_ids)
    hidden = body(input_ids=ids, attention_mask=None, position_ids=position_ids, use_cache=False).last_hidden_state
    return plan.unpack(hidden, tuple(mask.shape))


_SUPPORTED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
_PROBE_ROWS = ((3, 1, 4, 1, 5), (9, 2, 6))
"""Token ids (modulo the vocabulary) of the probe's two sequences; the first is replaced by
``_PROBE_OTHER`` to check that the second does not see it."""
_PROBE_OTHER = (7, 8, 2, 8, 1)


def _vocab_size(body: torch.nn.Module) -> int:
    embeddings = body.get_input_embeddings() if hasattr(body, "get_input_embeddings") else None
    size = getattr(embeddings, "num_embeddings", None) or getattr(getattr(body, "config", None), "vocab_size", None)
    return int(size) if size else 10


def _probe(body: torch.nn.Module, device: torch.device) -> str | None:
    """Why ``body`` does not compute packed rows as padded ones, or None (see ``packing_supported``)."""
    vocab = _vocab_size(body)
    width = max(map(len, _PROBE_ROWS)) + 1
    ids = torch.zeros(len(_PROBE_ROWS), width, dtype=torch.long)
    mask = torch.zeros(len(_PROBE_ROWS), width, dtype=torch.bool)
    for r, row in enumerate(_PROBE_ROWS):
        start = 0 if r == 0 else width - len(row)  # the first right-padded, the second left-padded
        ids[r, start:start + len(row)] = torch.tensor(row) % vocab
        mask[r, start:start + len(row)] = True
    other = ids.clone()
    other[0, :len(_PROBE_OTHER)] = torch.tensor(_PROBE_OTHER) % vocab
    ids, other, mask = ids.to(device), other.to(device), mask.to(device)
    one_bin = int(mask.sum()) + 1  # both rows and a leftover token in one bin
    with torch.no_grad():
        padded = padded_hidden_states(body, ids, mask)
        packed = packed_hidden_states(body, ids, mask, capacity=one_bin)
        packed_other = packed_hidden_states(body, other, mask, capacity=one_bin)
    low = padded.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(device.type)
    padded, packed, packed_other = (h[mask].float() for h in (padded, packed, packed_other))
    scale = 1.0 + float(padded.abs().max())
    gap = float((packed - padded).abs().max())
    if not gap <= (2e-2 if low else 1e-4) * scale:  # NaN fails too
        return f"packed hidden states differ from padded ones by {gap:.3g}"
    second = slice(len(_PROBE_ROWS[0]), None)  # the second row's tokens, row-major after the first's
    leak = float((packed_other[second] - packed[second]).abs().max())
    if not leak <= (1e-3 if low else 1e-5) * scale:
        return f"a packed sequence sees the one before it (its hidden states move by {leak:.3g})"
    return None


def packing_supported(body: torch.nn.Module, device: torch.device | None = None) -> bool:
    """Whether ``body`` computes the same hidden states packed as padded; probed once per body and
    attention implementation, in eval mode without gradients (the modules' modes are restored).

    The probe packs two rows (one right-, one left-padded) into one bin with a leftover token. The
    packed hidden states must equal the padded forward's within 1e-4 (float32) or 2e-2 (16-bit or
    autocast) of the largest magnitude, and the second sequence's must not change (1e-5, or 1e-3)
    when the first one's tokens do. A body that fails, or raises, keeps the padded forward: packing
    never changes the values computed (ALiBi models and OPT fail; Llama, Qwen2, Gemma2, GPT-2 and
    GPT-NeoX pass with sdpa and eager attention)."""
    impl = getattr(getattr(body, "config", None), "_attn_implementation", None)
    known = _SUPPORTED.setdefault(body, {})
    if impl in known:
        return known[impl]
    modes = [(m, m.training) for m in body.modules()]
    body.eval()
    try:
        reason = _probe(body, device if device is not None else next(body.parameters()).device)
    except Exception as e:  # a model that refuses packed inputs: padded it is
        reason = f"a packed forward raised {type(e).__name__}: {e}".splitlines()[0]
    finally:
        for module, training in modes:
            module.training = training
    if reason is not None:
        warnings.warn(f"sequence packing is off for {type(body).__name__} (attn_implementation={impl!r}): {reason}; "
                      f"its forwards run on the padded batch", RuntimeWarning, stacklevel=2)
    known[impl] = reason is None
    return reason is None


def hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of ``body`` (a causal LM's ``base_model``) on the padded batch
    ``input_ids`` / ``mask`` (bool ``[B, T]``, real tokens True), aligned with it; zero at padding when
    packed. Packed (``packed_hidden_states``) where the body supports it, padded otherwise."""
    mask = mask.bool()
    if packing_supported(body, input_ids.device):
        return packed_hidden_states(body, input_ids, mask)
    return padded_hidden_states(body, input_ids, mask)

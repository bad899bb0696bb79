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

Rows that share a prefix (a group's prompt, a chat template's system prompt, identical answers)
compute it once in a prefix tree (``plan_prefix_tree``): rows sorted by their tokens reuse their
predecessor's slots for the prefix they share, and a 4-D boolean attention mask lets each slot see
only its own row's earlier tokens. A batch runs as a tree where its ``forward_cost`` is below packed
rows' (``chosen_prefix_tree``), in trees of the width that costs least: wider trees share more (a system
prompt across groups), but a masked bin's attention costs its width squared. On SmolLM2 fp32, 4 prompts x
4 answers of about 90 tokens, trees of one group each (about 250 slots) rather than one of about 1000 take
the update from 7.6 to 6.3 s per iteration on one thread (``scripts/bench_vs_trl.py``). Measured on 2 CPU
cores with SmolLM2-135M, an iteration of the word-problem recipe (4 prompts x 8 answers,
``scripts/bench_prefix_sharing.py --full``): the update's forward and backward in 0.77x the packed rows'
time, the no-grad forward in 0.83x.

Values equal the padded forward's up to float32 rounding (a sequence's offset in its bin changes
how sdpa blocks its softmax, as a different left padding does). Whether a model honours packed
position ids, and the tree's mask, is probed once per body and attention implementation
(``packing_supported``, ``prefix_tree_supported``): one that does not (ALiBi models such as Bloom,
OPT, custom attention, ...) keeps the padded forward; one that ignores or adds the 4-D mask (eager
attention, flash-attention kernels) keeps packed rows.
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
    attention: torch.Tensor | None = None
    """Bool ``[n_bins, 1, width, width]`` (query slot, key slot): which slots each slot attends to,
    for layouts in which rows share slots (``plan_prefix_tree``); None: position ids restarting at 0
    mark the sequences (block-diagonal causal attention)."""

    def pack(self, input_ids: torch.Tensor, fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed input ids, position ids)``, both ``[n_bins, width]``. A bin's leftover holds
        ``fill`` tokens at position 0: each one a sequence of its own, attending only to itself. A
        shared slot is written once per row that reads it, with the same token and position."""
        ids = input_ids.new_full((self.n_bins, self.width), fill)
        ids[self.bins, self.slots] = input_ids[self.rows, self.cols]
        position_ids = torch.zeros_like(ids)
        position_ids[self.bins, self.slots] = self.positions
        return ids, position_ids

    def unpack(self, packed: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """``[n_bins, width, ...]`` outputs back to ``[B, T, ...]`` (``shape = (B, T)``), zero at padding;
        differentiable. A slot that several rows read gets the sum of their gradients in index order
        (``index_select``'s backward, ``index_add_``), so the sum is the same on every run."""
        out = packed.new_zeros((*shape, *packed.shape[2:]))
        picked = packed.flatten(0, 1).index_select(0, self.bins * self.width + self.slots)
        return out.index_put((self.rows, self.cols), picked)


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


PREFIX_TREE_WIDTH = 1024
"""Most slots of a prefix-tree bin (or the longest row, if longer): attention over a bin costs its
width squared, so rows sharing a prompt fill bins of at most this width (``plan_prefix_tree``)."""


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of the 1-D token tensors ``a`` and ``b``."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def _prefix_trees(lengths: list[int], order: list[int], common: list[int],
                  width: int) -> tuple[list[list[int]], dict[int, int], list[int]]:
    """``(trees, shared, sizes)``: consecutive rows of ``order`` (sorted by their tokens; ``common[k]`` the
    prefix row ``order[k]`` shares with its predecessor) grouped into trees of at most ``width`` slots, the
    tokens each row reuses from its predecessor in its tree, and each tree's slots."""
    trees: list[list[int]] = []
    shared: dict[int, int] = {}
    sizes: list[int] = []
    for k, row in enumerate(order):
        if trees and sizes[-1] + lengths[row] - common[k] <= width:  # the row's new slots fit its predecessor's
            trees[-1].append(row)
            shared[row] = common[k]
            sizes[-1] += lengths[row] - common[k]
        else:
            trees.append([row])
            shared[row] = 0
            sizes.append(lengths[row])
    return trees, shared, sizes


def plan_prefix_tree(input_ids: torch.Tensor, mask: torch.Tensor, width: int | None = None,
                     layer_shape: tuple[int, int] | None = None) -> Packing | None:
    """The ``Packing`` of the real tokens (``mask`` True, ``[B, T]``) with each prefix common to several
    rows computed once, or None when no two rows share one.

    Rows sorted by their tokens form a prefix tree: row k reuses the slots of its predecessor's first
    ``lcp(k - 1, k)`` tokens (the longest common prefix) and adds slots for the rest, so a group's
    prompt (and a system prompt common to all, and identical answers) takes slots once. Consecutive
    sorted rows fill trees of at most ``width`` slots, packed first-fit-decreasing into bins as wide as
    the widest. Without ``width``: the width of least ``forward_cost`` for a decoder layer of
    ``layer_shape`` (``(hidden_size, layer_params)``) among the longest row times 1, 2, 4, ... up to
    ``PREFIX_TREE_WIDTH`` (wider trees share more prefixes, but attention over a bin costs its width
    squared), or ``max(PREFIX_TREE_WIDTH, longest row)`` without ``layer_shape``. A slot attends to the
    slots of its row's own earlier tokens (``attention``), whatever rows reuse it, so every row's hidden
    states are those of the row alone; position ids count each row's real tokens, as ``plan_packing``'s."""
    mask = mask.bool()
    lengths = mask.sum(-1).tolist()
    tokens = [input_ids[r][mask[r]] for r in range(len(lengths))]
    order = sorted((r for r in range(len(lengths)) if lengths[r]), key=lambda r: tokens[r].tolist())
    if len(order) < 2:
        return None
    common = [0] + [_common_prefix(tokens[a], tokens[b]) for a, b in zip(order, order[1:])]
    longest = max(lengths)
    if width is None and layer_shape is None:
        width = max(PREFIX_TREE_WIDTH, longest)
    if width is None:
        candidates = [longest]
        while candidates[-1] * 2 <= PREFIX_TREE_WIDTH:
            candidates.append(candidates[-1] * 2)

        def cost(w: int) -> int:
            sizes = _prefix_trees(lengths, order, common, w)[2]
            return _bins_cost(len(first_fit_decreasing(sizes, max(sizes))), max(sizes), *layer_shape)

        width = min(candidates, key=cost)
    trees, shared, sizes = _prefix_trees(lengths, order, common, width)
    if sum(sizes) == sum(lengths):
        return None
    bins = first_fit_decreasing(sizes, max(sizes))
    n_bins, bin_width = len(bins), max(sizes)
    slots_of: dict[int, torch.Tensor] = {}  # row -> the slot of each of its real tokens
    bin_of: dict[int, int] = {}
    attention = torch.zeros(n_bins, bin_width, bin_width, dtype=torch.bool)
    for b, members in enumerate(bins):
        start = 0
        for tree in members:
            path = torch.zeros(0, dtype=torch.long)
            for row in trees[tree]:
                own = torch.arange(start, start + lengths[row] - shared[row])
                start += len(own)
                path = torch.cat([path[:shared[row]], own])
                slots_of[row], bin_of[row] = path, b
                # The row's own slots see its path up to themselves (causal within the row).
                causal = torch.ones(lengths[row], lengths[row], dtype=torch.bool).tril()[shared[row]:]
                attention[b, own.unsqueeze(1), path.unsqueeze(0)] = causal
        leftover = torch.arange(start, bin_width)
        attention[b, leftover, leftover] = True  # fill tokens attend to themselves only
    rows, cols = mask.nonzero(as_tuple=True)
    positions = (mask.long().cumsum(-1) - 1)[rows, cols]
    device = mask.device
    token_bins = torch.tensor([bin_of[r] for r in rows.tolist()], dtype=torch.long, device=device)
    slots = torch.cat([slots_of[r] for r in range(len(lengths)) if lengths[r]]).to(device)  # row-major, as rows
    return Packing(rows, cols, token_bins, slots, positions, n_bins, bin_width, attention.unsqueeze(1).to(device))


def forward_cost(plan: Packing, hidden_size: int, layer_params: int) -> int:
    """Multiply-adds of one decoder layer's forward over ``plan``'s bins: its ``layer_params`` weights
    on every slot, and attention (scores and their weighted sum, ``hidden_size`` wide) over each bin's
    width squared, which a masked kernel computes whole. The backward pass scales both alike."""
    return _bins_cost(plan.n_bins, plan.width, hidden_size, layer_params)


def _bins_cost(n_bins: int, width: int, hidden_size: int, layer_params: int) -> int:
    return n_bins * width * (layer_params + 2 * width * hidden_size)


_LAYER_PARAMS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()


def _layer_shape(body: torch.nn.Module) -> tuple[int, int]:
    """``(hidden_size, weights per decoder layer)`` of a transformers body (its parameters but the
    input embeddings, over its layers)."""
    config = body.config
    if body not in _LAYER_PARAMS:
        embeddings = body.get_input_embeddings().weight.numel()
        _LAYER_PARAMS[body] = (sum(p.numel() for p in body.parameters()) - embeddings) // config.num_hidden_layers
    return config.hidden_size, _LAYER_PARAMS[body]


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
    return planned_hidden_states(body, input_ids, mask, plan)


def planned_hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor,
                          plan: Packing) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of ``body`` run on the layout ``plan`` of the batch (its ``attention``
    mask, if any, passed as a 4-D mask), zero at padding."""
    ids, position_ids = plan.pack(input_ids)
    hidden = body(input_ids=ids, attention_mask=plan.attention, position_ids=position_ids,
                  use_cache=False).last_hidden_state
    return plan.unpack(hidden, tuple(mask.shape))


_SUPPORTED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
_PROBE_ROWS = ((3, 1, 4, 1, 5), (9, 2, 6))
"""Token ids (modulo the vocabulary) of the probe's two sequences; the first is replaced by
``_PROBE_OTHER`` to check that the second does not see it."""
_PROBE_OTHER = (7, 8, 2, 8, 1)
_PROBE_TREE_ROWS = ((3, 1, 4, 1, 5, 9), (3, 1, 4, 1, 2, 6, 5), (8, 9, 7))
"""The prefix-tree probe's sequences: the first two share four tokens; the first's own tokens are
replaced by ``_PROBE_TREE_OTHER`` to check that the second does not see them."""
_PROBE_TREE_OTHER = (7, 7)


def _vocab_size(body: torch.nn.Module) -> int:
    embeddings = body.get_input_embeddings() if hasattr(body, "get_input_embeddings") else None
    size = getattr(embeddings, "num_embeddings", None) or getattr(getattr(body, "config", None), "vocab_size", None)
    return int(size) if size else 10


def _probe_batch(rows, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (token ids modulo ``vocab``) as a padded batch one token wider than the longest row,
    the first row right-padded and the others left-padded."""
    width = max(map(len, rows)) + 1
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for r, row in enumerate(rows):
        start = 0 if r == 0 else width - len(row)
        ids[r, start:start + len(row)] = torch.tensor(row) % vocab
        mask[r, start:start + len(row)] = True
    return ids.to(device), mask.to(device)


def _probe(body: torch.nn.Module, device: torch.device, layout: str) -> str | None:
    """Why ``body`` does not compute the rows laid out as ``layout`` ('packed': ``plan_packing``,
    'prefix_tree': ``plan_prefix_tree``) as it computes them padded, or None (see ``packing_supported``)."""
    vocab = _vocab_size(body)
    rows, other_tokens = (_PROBE_ROWS, _PROBE_OTHER) if layout == "packed" else (_PROBE_TREE_ROWS, _PROBE_TREE_OTHER)
    ids, mask = _probe_batch(rows, vocab, device)
    other = ids.clone()
    changed = slice(len(rows[0]) - len(other_tokens), len(rows[0]))  # the first row is right-padded
    other[0, changed] = torch.tensor(other_tokens, device=device) % vocab

    def laid_out(input_ids):
        if layout == "packed":  # both rows and a leftover token in one bin
            return packed_hidden_states(body, input_ids, mask, capacity=int(mask.sum()) + 1)
        plan = plan_prefix_tree(input_ids, mask)
        if plan is None or plan.n_bins != 1:
            raise AssertionError("the prefix-tree probe's rows must share a prefix and fit one bin")
        return planned_hidden_states(body, input_ids, mask, plan)

    with torch.no_grad():
        padded = padded_hidden_states(body, ids, mask)
        packed, packed_other = laid_out(ids), laid_out(other)
    low = padded.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(device.type)
    padded, packed, packed_other = (h[mask].float() for h in (padded, packed, packed_other))
    scale = 1.0 + float(padded.abs().max())
    gap = float((packed - padded).abs().max())
    if not gap <= (2e-2 if low else 1e-4) * scale:  # NaN fails too
        return f"{layout} hidden states differ from padded ones by {gap:.3g}"
    later = slice(len(rows[0]), None)  # the other rows' tokens, row-major after the first's
    leak = float((packed_other[later] - packed[later]).abs().max())
    if not leak <= (1e-3 if low else 1e-5) * scale:
        return f"a {layout} sequence sees another one's tokens (its hidden states move by {leak:.3g})"
    return None


def _supported(body: torch.nn.Module, device: torch.device | None, layout: str) -> bool:
    """Whether ``body`` computes ``layout`` as padded rows (``_probe``), probed once per body, attention
    implementation and layout, in eval mode without gradients (the modules' modes are restored); a
    body that fails or raises gets a warning naming why."""
    impl = getattr(getattr(body, "config", None), "_attn_implementation", None)
    known = _SUPPORTED.setdefault(body, {})
    if (impl, layout) in known:
        return known[impl, layout]
    modes = [(m, m.training) for m in body.modules()]
    body.eval()
    try:
        reason = _probe(body, device if device is not None else next(body.parameters()).device, layout)
    except Exception as e:  # a model that refuses the layout's inputs: it runs without that layout
        reason = f"a {layout} forward raised {type(e).__name__}: {e}".splitlines()[0]
    finally:
        for module, training in modes:
            module.training = training
    if reason is not None:
        what, fallback = (("sequence packing", "the padded batch") if layout == "packed" else
                          ("prefix sharing", "packed rows, each computing its own prefix"))
        warnings.warn(f"{what} is off for {type(body).__name__} (attn_implementation={impl!r}): {reason}; "
                      f"its forwards run on {fallback}", RuntimeWarning, stacklevel=3)
    known[impl, layout] = reason is None
    return reason is None


def packing_supported(body: torch.nn.Module, device: torch.device | None = None) -> bool:
    """Whether ``body`` computes the same hidden states packed as padded; probed once per body and
    attention implementation, in eval mode without gradients (the modules' modes are restored).

    The probe packs two rows (one right-, one left-padded) into one bin with a leftover token. The
    packed hidden states must equal the padded forward's within 1e-4 (float32) or 2e-2 (16-bit or
    autocast) of the largest magnitude, and the second sequence's must not change (1e-5, or 1e-3)
    when the first one's tokens do. A body that fails, or raises, keeps the padded forward: packing
    never changes the values computed (ALiBi models and OPT fail; Llama, Qwen2, Gemma2, GPT-2 and
    GPT-NeoX pass with sdpa and eager attention)."""
    return _supported(body, device, "packed")


def prefix_tree_supported(body: torch.nn.Module, device: torch.device | None = None) -> bool:
    """Whether ``body`` computes the same hidden states in a prefix tree (``plan_prefix_tree``: shared
    slots, a 4-D attention mask) as padded; probed as ``packing_supported`` is, on two rows sharing a
    prefix and a third one. A body that ignores or refuses a 4-D boolean mask (eager attention, which
    adds the mask to its scores; flash-attention kernels) fails and runs packed rows instead."""
    return _supported(body, device, "prefix_tree")


def chosen_prefix_tree(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> Packing | None:
    """The prefix tree (``plan_prefix_tree``) that ``hidden_states`` runs ``body`` on for this batch: where
    the body supports it and its ``forward_cost`` is below packed rows' (the prompts it saves outweigh
    its wider bins); None otherwise. The body must support packing (``packing_supported``)."""
    # Probed whatever this batch holds: a sharded body's probe is a collective, run by every rank at once.
    if not prefix_tree_supported(body, input_ids.device):
        return None
    shape = _layer_shape(body)
    tree = plan_prefix_tree(input_ids, mask, layer_shape=shape)
    if tree is None:
        return None
    return tree if forward_cost(tree, *shape) < forward_cost(plan_packing(mask), *shape) else None


def hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of ``body`` (a causal LM's ``base_model``) on the padded batch
    ``input_ids`` / ``mask`` (bool ``[B, T]``, real tokens True), aligned with it; zero at padding when
    packed. In a prefix tree where rows share prefixes and that is cheaper (``chosen_prefix_tree``),
    packed (``packed_hidden_states``) otherwise where the body supports that, padded else."""
    mask = mask.bool()
    if not packing_supported(body, input_ids.device):
        return padded_hidden_states(body, input_ids, mask)
    tree = chosen_prefix_tree(body, input_ids, mask)
    if tree is not None:
        return planned_hidden_states(body, input_ids, mask, tree)
    return packed_hidden_states(body, input_ids, mask)

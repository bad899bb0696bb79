"""RolloutBatch: the trajectories of one RL iteration, label-aligned ``[B, T]`` (docs/algorithms.md#data-layout).

Row b is prompt + completion (+ environment turns), right-padded. Per-token fields describe the
token AT that index; ``rewards`` is one raw task reward per row (before any shaping), to be placed
on the row's last generated token by the trainer. Rows are grouped by prompt: the first
``group_sizes[0]`` rows share a prompt, then the next ``group_sizes[1]``, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor
    """[B, T] long: prompt and generated tokens, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """[B, T] bool: True on real tokens, False on padding."""
    loss_mask: torch.Tensor
    """[B, T] bool: True iff the policy generated token t (trainable), stop token included."""
    behave_logp: torch.Tensor
    """[B, T] float32: the engine's log-prob of token t under the sampling distribution; 0 elsewhere."""
    versions: torch.Tensor
    """[B, T] long: policy version that generated token t; -1 elsewhere."""
    turn_ids: torch.Tensor
    """[B, T] long: assistant turn index of generated token t; -1 elsewhere."""
    rewards: torch.Tensor
    """[B] float32: raw task reward of each row."""
    truncated: torch.Tensor
    """[B] bool: generation hit max_new_tokens without a stop token (the value bootstraps)."""
    group_sizes: torch.Tensor
    """[G] long: rows per prompt group, in row order; sums to B."""
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)
    """Reward function name -> [B] float32: its own value in each row (NaN where it gave none), for a task
    whose reward is a weighted sum of several; empty otherwise."""
    prompts: list[str] = field(default_factory=list)
    """[B] prompt text of each row, for logging (may be empty)."""
    completions: list[str] = field(default_factory=list)
    """[B] completion text of each row, for logging (may be empty)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Statistics of the collection that produced the batch (accepted / rejected groups, time), for logging."""

    _TENSOR_ROWS = ("input_ids", "attention_mask", "loss_mask", "behave_logp", "versions", "turn_ids",
                    "rewards", "truncated")

    def __post_init__(self):
        B, T = self.input_ids.shape
        for name in ("attention_mask", "loss_mask", "behave_logp", "versions", "turn_ids"):
            if tuple(getattr(self, name).shape) != (B, T):
                raise ValueError(
                    f"RolloutBatch.{name} must have shape ({B}, {T}), got {tuple(getattr(self, name).shape)}")
        for name in ("rewards", "truncated"):
            if tuple(getattr(self, name).shape) != (B,):
                raise ValueError(f"RolloutBatch.{name} must have shape ({B},), got {tuple(getattr(self, name).shape)}")
        for name, values in self.reward_terms.items():
            if tuple(values.shape) != (B,):
                raise ValueError(f"RolloutBatch.reward_terms[{name!r}] must have shape ({B},), got "
                                 f"{tuple(values.shape)}")
        if int(self.group_sizes.sum()) != B:
            raise ValueError(f"RolloutBatch.group_sizes sum to {int(self.group_sizes.sum())}, the batch has {B} rows")
        for name in ("prompts", "completions"):
            if getattr(self, name) and len(getattr(self, name)) != B:
                raise ValueError(f"RolloutBatch.{name} must have {B} entries or none")

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.group_sizes.shape[0]

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B] number of generated tokens per row (all turns)."""
        return self.loss_mask.sum(1)

    def to(self, device: torch.device | str) -> "RolloutBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        moved["reward_terms"] = {name: values.to(device) for name, values in self.reward_terms.items()}
        return RolloutBatch(**moved)

    def select(self, rows: torch.Tensor | list[int]) -> "RolloutBatch":
        """The given rows (a minibatch); each row becomes its own group, trimmed to its longest row."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(1).max()) if len(rows) else 0
        picked = {name: getattr(self, name)[rows] for name in self._TENSOR_ROWS}
        for name in ("input_ids", "attention_mask", "loss_mask", "behave_logp", "versions", "turn_ids"):
            picked[name] = picked[name][:, :width]
        text = {name: [getattr(self, name)[i] for i in rows.tolist()] if getattr(self, name) else []
                for name in ("prompts", "completions")}
        terms = {name: values[rows] for name, values in self.reward_terms.items()}
        return RolloutBatch(**picked, group_sizes=torch.ones(len(rows), dtype=torch.long), reward_terms=terms, **text)

    def select_groups(self, groups: list[int]) -> "RolloutBatch":
        """The rows of the given prompt groups, in that order, groups kept, trimmed to their longest row."""
        starts = [0, *self.group_sizes.cumsum(0).tolist()]
        picked = self.select([r for g in groups for r in range(starts[g], starts[g + 1])])
        picked.group_sizes = self.group_sizes[torch.as_tensor(groups, dtype=torch.long)]
        return picked

    @staticmethod
    def concat(batches: list["RolloutBatch"], pad_id: int) -> "RolloutBatch":
        """Rows of all batches in order, right-padded to the widest; groups are kept."""
        width = max(b.input_ids.shape[1] for b in batches)
        pad_values = {"input_ids": pad_id, "attention_mask": False, "loss_mask": False, "behave_logp": 0.0,
                      "versions": -1, "turn_ids": -1}
        out = {}
        for name, value in pad_values.items():
            out[name] = torch.cat([torch.nn.functional.pad(getattr(b, name), (0, width - b.input_ids.shape[1]),
                                                           value=value) for b in batches])
        for name in ("rewards", "truncated", "group_sizes"):
            out[name] = torch.cat([getattr(b, name) for b in batches])
        names = batches[0].reward_terms.keys()
        if all(b.reward_terms.keys() == names for b in batches):
            out["reward_terms"] = {name: torch.cat([b.reward_terms[name] for b in batches]) for name in names}
        for name in ("prompts", "completions"):
            out[name] = [s for b in batches for s in getattr(b, name)] if all(getattr(b, name) for b in batches) else []
        return RolloutBatch(**out)

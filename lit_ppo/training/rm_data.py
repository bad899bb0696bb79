"""The data module of ``python -m lit_ppo rm``: the preference pairs of ``lit_ppo.training.rm_examples`` in
batches of both sides, run as sft's examples are (``lit_ppo.training.sft_data``)."""

from __future__ import annotations

import torch

from lit_ppo.config.rm import RMConfig
from lit_ppo.training.rm_examples import PairExample, RMPairs
from lit_ppo.training.sft_data import ExampleDataModule


def collate_pairs(examples: list[PairExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` ``[2B, T]``, the chosen sides first, then the rejected
    ones (one forward pass scores both), and ``margin`` ``[B]``."""
    rows = [e.chosen_ids for e in examples] + [e.rejected_ids for e in examples]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
        attention[b, :len(row)] = 1
    return {"input_ids": ids, "attention_mask": attention,
            "margin": torch.tensor([e.margin for e in examples], dtype=torch.float32)}


class RMDataModule(ExampleDataModule):
    """The pairs of the train and test splits (``RMPairs``), run as sft's examples are (``ExampleDataModule``):
    its optimizer steps are ``rm.epochs`` passes over them, its evaluations one per pass.

    Args:
        task: the registered task or dotted path (``data.task``): ``dataset`` for rows of pairs.
        task_kwargs: its settings (``data.task_kwargs``).
        rm: the ``rm`` section.
        seed: the shuffle's seed.
    """

    def __init__(self, task: str, task_kwargs: dict | None, rm: RMConfig, seed: int = 0):
        # The pairs are read before any model loads: bad data is one line.
        super().__init__(task, task_kwargs, rm, RMPairs(task, task_kwargs, rm), seed)

    def collate(self, examples: list[PairExample]) -> dict[str, torch.Tensor]:
        return collate_pairs(examples, self.pad_id)

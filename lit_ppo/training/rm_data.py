"""The data module of ``python -m lit_ppo rm``: the preference pairs of ``lit_ppo.training.rm_examples`` in
batches of both sides, run as sft's examples are (``lit_ppo.training.sft_data``)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_ppo.config.rm import RMConfig
from lit_ppo.training.rm_examples import PairExample, RMPairs
from lit_ppo.training.sft_data import StepBatches, step_batches


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


class RMDataModule(L.LightningDataModule):
    """The pairs of the train and test splits, tokenised by the module's tokenizer when the fit sets up, which
    then runs their batches (``lit_ppo.training.sft_data.step_batches``, as sft's) once in their order: its
    optimizer steps are ``rm.epochs`` passes over them (fewer for a ``trainer.max_steps`` given), its evaluations
    one per pass.

    Args:
        task: the registered task or dotted path (``data.task``): ``dataset`` for rows of pairs.
        task_kwargs: its settings (``data.task_kwargs``).
        rm: the ``rm`` section.
        seed: the shuffle's seed.
    """

    def __init__(self, task: str, task_kwargs: dict | None, rm: RMConfig, seed: int = 0):
        super().__init__()
        self.task, self.task_kwargs = task, task_kwargs  # what the checkpoints record (LitRM's record)
        self.cfg = rm
        self.seed = seed
        self.splits = RMPairs(task, task_kwargs, rm)  # before any model loads: bad data is one line
        self.examples: dict[str, list[PairExample]] = self.splits.examples
        self.pad_id = 0

    def tokenize(self, tokenizer) -> None:
        """Tokenise both splits with ``tokenizer`` (the model's, with its chat template)."""
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.splits.tokenize(tokenizer)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        self.tokenize(trainer.lightning_module.tokenizer)
        per_epoch = self.steps_per_epoch(trainer.world_size)  # batches of one rank
        total = -(-per_epoch // trainer.accumulate_grad_batches) * self.cfg.epochs
        trainer.fit_loop.epoch_loop.max_steps = total if trainer.max_steps < 0 else min(trainer.max_steps, total)
        trainer.val_check_interval = per_epoch

    def batches(self, world: int) -> list[list[list[int]]]:
        """``step_batches`` of the training pairs for ``world`` ranks."""
        return step_batches(len(self.examples["train"]), self.cfg.batch_size, self.cfg.epochs, self.cfg.shuffle,
                            self.seed, world)

    def steps_per_epoch(self, world: int) -> int:
        """Optimizer steps of one pass over the training pairs on ``world`` ranks (no accumulation)."""
        return len(self.batches(world)[0]) // self.cfg.epochs

    def loader(self, examples: list[PairExample], **kwargs: Any) -> DataLoader:
        """A DataLoader of ``examples`` collated as pairs (``collate_pairs``)."""
        return DataLoader(examples, collate_fn=lambda batch: collate_pairs(batch, self.pad_id), **kwargs)

    def train_dataloader(self) -> DataLoader:
        # Built after a resume has restored the step: the run takes up the batch after the last one trained.
        trainer = self.trainer
        start = trainer.global_step * trainer.accumulate_grad_batches
        return self.loader(self.examples["train"],
                           batch_sampler=StepBatches(self.batches(trainer.world_size)[trainer.global_rank], start))

    def val_dataloader(self) -> DataLoader | list:
        if not self.examples.get("test"):
            return []
        trainer = self.trainer
        return self.loader(self.examples["test"][trainer.global_rank::trainer.world_size],
                           batch_size=self.cfg.batch_size)

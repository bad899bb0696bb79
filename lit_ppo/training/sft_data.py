"""The examples of ``python -m lit_ppo sft`` (``lit_ppo.training.sft_examples``) as a LightningDataModule: tokenised
by the policy's tokenizer when the fit sets up, in batches laid out once for the whole run (``step_batches``),
so that a resume takes up the batch after the last one trained."""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_ppo.config.sft import SFTConfig
from lit_ppo.training.sft_examples import SFTExample, SFTExamples


def step_batches(n: int, batch_size: int, epochs: int, shuffle: bool, seed: int, world: int) -> list[list[list[int]]]:
    """For each of ``world`` ranks, the example indices of each of its batches over the whole run: epoch e
    is the order ``0..n-1``, permuted with seed ``seed + e`` if ``shuffle``, topped up from its start to a
    multiple of ``world`` (as a DistributedSampler pads); each step takes its next ``batch_size * world``
    examples (the epoch's last step fewer), rank r every world-th of them from the r-th. One list for the
    run, so that a resumed run takes up the very batch after the last one trained."""
    ranks: list[list[list[int]]] = [[] for _ in range(world)]
    for epoch in range(epochs):
        order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist() if shuffle
                 else list(range(n)))
        order += order[:-len(order) % world]
        for start in range(0, len(order), batch_size * world):
            step = order[start:start + batch_size * world]
            for rank in range(world):
                ranks[rank].append(step[rank::world])
    return ranks


class StepBatches(torch.utils.data.Sampler):
    """The batches of one rank (``step_batches``) from the ``start``-th on. Its length is the whole run's:
    a resumed Lightning loop counts the batches it restored among those of the epoch it goes on with."""

    def __init__(self, batches: list[list[int]], start: int):
        self.batches, self.start = batches, start

    def __iter__(self):
        return iter(self.batches[self.start:])

    def __len__(self) -> int:
        return len(self.batches)


def collate(examples: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` ``[B, T]``."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(examples), width, dtype=torch.long)
    loss_mask = torch.zeros(len(examples), width, dtype=torch.bool)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(e.loss_mask)
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


class ExampleDataModule(L.LightningDataModule):
    """What the data modules of the jobs that train on examples of their own (sft, rm) do alike: their splits
    (``splits``: read when the module is built, so that bad data is one line before any model loads) tokenised
    by the module's tokenizer when the fit sets up, which then runs their batches (``step_batches``) once in
    their order: its optimizer steps are ``cfg.epochs`` passes over them (fewer for a ``trainer.max_steps``
    given), its evaluations one per pass. ``collate`` makes a batch of examples."""

    def __init__(self, task: str, task_kwargs: dict | None, cfg, splits, seed: int):
        super().__init__()
        self.task, self.task_kwargs = task, task_kwargs  # what the checkpoints record (ExampleJobModule's record)
        self.cfg, self.splits, self.seed = cfg, splits, seed
        self.examples: dict[str, list] = splits.examples
        self.pad_id = 0

    def collate(self, examples: list) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def tokenize(self, tokenizer) -> None:
        """Tokenise both splits with ``tokenizer`` (the model's, with its chat template)."""
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.splits.tokenize(tokenizer)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        self.tokenize(trainer.lightning_module.tokenizer)
        # One pass over the run's batches in their order, so that a resume takes up the batch after the last
        # one trained (the trainer runs one endless epoch); its steps and evaluations count the passes.
        per_epoch = self.steps_per_epoch(trainer.world_size)  # batches of one rank
        total = -(-per_epoch // trainer.accumulate_grad_batches) * self.cfg.epochs
        trainer.fit_loop.epoch_loop.max_steps = total if trainer.max_steps < 0 else min(trainer.max_steps, total)
        trainer.val_check_interval = per_epoch

    def batches(self, world: int) -> list[list[list[int]]]:
        """``step_batches`` of the training examples for ``world`` ranks."""
        return step_batches(len(self.examples["train"]), self.cfg.batch_size, self.cfg.epochs, self.cfg.shuffle,
                            self.seed, world)

    def steps_per_epoch(self, world: int) -> int:
        """Optimizer steps of one pass over the training examples on ``world`` ranks (no accumulation)."""
        return len(self.batches(world)[0]) // self.cfg.epochs

    def loader(self, examples: list, **kwargs: Any) -> DataLoader:
        """A DataLoader of ``examples`` collated by ``collate``."""
        return DataLoader(examples, collate_fn=self.collate, **kwargs)

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


class SFTDataModule(ExampleDataModule):
    """The examples of the train and test splits (``SFTExamples``), run as ``ExampleDataModule`` runs them.

    Args:
        task: the registered task or dotted path (``data.task``).
        task_kwargs: its settings (``data.task_kwargs``).
        sft: the ``sft`` section.
        system_prompt: ``data.system_prompt``.
        seed: the shuffle's seed.
    """

    def __init__(self, task: str, task_kwargs: dict | None, sft: SFTConfig, system_prompt: str | None = None,
                 seed: int = 0):
        # The examples are read before any model loads: bad data is one line.
        super().__init__(task, task_kwargs, sft, SFTExamples(task, task_kwargs, sft, system_prompt), seed)

    def collate(self, examples: list[SFTExample]) -> dict[str, torch.Tensor]:
        return collate(examples, self.pad_id)

"""A rank's endless stream of training prompts, and the position in it that a checkpoint keeps.

Every epoch the task's train problems are put in a fresh order, a permutation seeded by the run's seed
and the epoch, and rank r of a world of w reads every w-th of them from position r: the ranks' shards
never overlap and together cover the epoch. The stream also counts the generate requests made from
it, whose sampling seeds derive from that count: a resumed run samples what the uninterrupted one would.
"""

from __future__ import annotations

import hashlib

import torch

from lit_ppo.tasks.base import Problem, Task


def stable_seed(*parts: int) -> int:
    """A 63-bit seed mixing the parts (stable across runs and platforms)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class PromptStream:
    """The train problems of ``task`` in seeded epochs, one shard per rank; ``epoch``, ``cursor`` (the
    next problem's place in this rank's shard) and ``requests`` (generate calls so far) are its position."""

    def __init__(self, task: Task, seed: int):
        self.task = task
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self.requests = 0

    def shard(self, rank: int, world: int) -> list[int]:
        """Rank ``rank``'s problem indices for the current epoch, in order."""
        problems = self.task.problems("train")
        generator = torch.Generator().manual_seed(stable_seed(self.seed, self.epoch))
        order = torch.randperm(len(problems), generator=generator)
        return order[rank::world].tolist()

    def take(self, k: int, rank: int, world: int) -> list[Problem]:
        """The next ``k`` problems of rank ``rank``'s shard, running on into the next epochs as needed."""
        problems = self.task.problems("train")
        out = []
        while len(out) < k:
            shard = self.shard(rank, world)
            if not shard:
                raise ValueError(f"task {self.task.name!r} has fewer train problems than ranks")
            take = shard[self.cursor:self.cursor + k - len(out)]
            out += [problems[i] for i in take]
            self.cursor += len(take)
            if self.cursor >= len(shard):
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def request_seed(self, rank: int) -> int:
        """The sampling seed of the next generate request of rank ``rank`` (counted)."""
        seed = stable_seed(self.seed, rank, self.requests)
        self.requests += 1
        return seed

    def position(self) -> dict:
        """Where the stream stands: what ``state_dict`` saves and ``restore`` takes."""
        return {"epoch": self.epoch, "cursor": self.cursor, "requests": self.requests}

    def restore(self, position: dict) -> None:
        """Continue from ``position`` (one of ``position``'s dicts)."""
        self.epoch, self.cursor, self.requests = position["epoch"], position["cursor"], position["requests"]

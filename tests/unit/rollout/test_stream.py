"""The prompt stream (``lit_ppo.rollout.stream``): the ranks' shards of each epoch, and the position it
resumes from."""

from __future__ import annotations

import pytest

from lit_ppo.rollout.stream import PromptStream, stable_seed
from tests.unit.fakes import Numbers


def test_the_ranks_shards_cover_each_epoch_once_and_the_stream_resumes_where_it_stood():
    stream = PromptStream(Numbers(10), seed=3)
    shards = [stream.shard(rank, 2) for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(10)) and len(shards[0]) == 5
    first = stream.take(4, rank=1, world=2)
    assert first == shards[1][:4] and stream.position() == {"epoch": 0, "cursor": 4, "requests": 0}
    across = stream.take(3, rank=1, world=2)  # the last of epoch 0, then epoch 1's own order
    assert across[0] == shards[1][4] and across[1:] == stream.shard(1, 2)[:2] and stream.epoch == 1
    assert stream.request_seed(1) == stable_seed(3, 1, 0) and stream.requests == 1
    resumed = PromptStream(Numbers(10), seed=3)
    resumed.restore(stream.position())
    assert resumed.take(3, 1, 2) == stream.take(3, 1, 2) and resumed.request_seed(1) == stream.request_seed(1)
    with pytest.raises(ValueError, match="task 'numbers' has fewer train problems than ranks"):
        PromptStream(Numbers(1), seed=0).take(1, rank=1, world=2)

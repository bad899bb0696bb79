"""Unit tests for ``lit_ppo.rollout.episodes.episode``: the Episode record and its RolloutBatch layout."""

from __future__ import annotations

import pytest

from lit_ppo.rollout.engines.protocol import Completion
from lit_ppo.rollout.episodes.episode import Episode, episodes_to_batch


def test_multi_segment_episode_gets_one_turn_id_per_generated_segment():
    """The layout a multi-turn (tool) workflow produces: prompt, answer, tool output, answer."""
    episode = Episode(prompt="q", completion="x", reward=0.5)
    episode.add_context([10, 11])
    episode.add_generation(Completion([20, 21], [-0.5, -0.25], stopped=True, version=3))
    episode.add_context([30])
    episode.add_generation(Completion([40, 41, 42], [-1.0, -2.0, -4.0], stopped=False, version=4))
    short = Episode(prompt="r")
    short.add_context([10])
    short.add_generation(Completion([50], [-0.125], stopped=True, version=4))

    batch = episodes_to_batch([episode, short], group_sizes=[2], pad_id=9)
    assert batch.input_ids.tolist() == [[10, 11, 20, 21, 30, 40, 41, 42], [10, 50, 9, 9, 9, 9, 9, 9]]
    assert batch.loss_mask.tolist() == [[False, False, True, True, False, True, True, True],
                                        [False, True] + [False] * 6]
    assert batch.turn_ids.tolist() == [[-1, -1, 0, 0, -1, 1, 1, 1], [-1, 0] + [-1] * 6]
    assert batch.versions.tolist() == [[-1, -1, 3, 3, -1, 4, 4, 4], [-1, 4] + [-1] * 6]
    assert batch.behave_logp.tolist() == [[0, 0, -0.5, -0.25, 0, -1.0, -2.0, -4.0], [0, -0.125] + [0] * 6]
    assert batch.attention_mask.tolist() == [[True] * 8, [True, True] + [False] * 6]
    # The last generation decides truncation.
    assert batch.truncated.tolist() == [True, False]
    assert batch.rewards.tolist() == [0.5, 0.0]


def test_episode_rejects_mismatched_logprobs():
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        Episode(prompt="q").add_generation(Completion([1, 2], [-0.5], stopped=True, version=0))

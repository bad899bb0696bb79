"""Rollout: engines that sample completions and the RolloutBatch they produce."""

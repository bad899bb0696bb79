"""Rollout: engines that sample completions, the workflows that turn them into the RolloutBatch of an
iteration, and the stream of prompts and the collector that fill one batch per iteration; what the trainer
reads of the data module holding them (``source``)."""

"""Rollout: engines that sample completions, the workflows that turn them into the RolloutBatch of an
iteration, and the stream of prompts and the collector that fill one batch per iteration; what the trainer
reads of the data module holding them (``source``); agents' episodes (``agent_workflow``) through an
OpenAI-compatible client (``chat_client``, in HTTP ``chat_endpoint``) whose tool calls are in the model's
words (``tool_calls``) and whose concurrent calls share engine calls (``shared_generate``)."""

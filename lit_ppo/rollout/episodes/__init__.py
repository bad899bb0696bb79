"""Episodes: how a task's problems are played through an engine and laid out as a ``RolloutBatch``. The
episode record and the batch layout (``episode``); the single-turn, multi-turn and agent workflows
(``single_turn``, ``multi_turn``, ``agent``) and the choice of one for a task (``choose``); a conversation
on token ids (``conversation``), which multi-turn episodes and agents' OpenAI-compatible client
(``chat_client``; over loopback HTTP, ``chat_endpoint``) continue; tool calls in each model family's
format (``tool_calls``)."""

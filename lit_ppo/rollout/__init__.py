"""Layer 4, rollouts: the ``RolloutBatch`` of an iteration, made by a rank's engine (``engines``) playing the
task's problems as episodes (``episodes``); the stream of prompts (``stream``) and the collector that fills
one batch per iteration from it (``collector``), dynamic filters (``filters``), the producer of
asynchronous rollouts (``producer``), the test-split scores (``evaluation``), and what the trainer reads of
the data module holding them (``source``)."""

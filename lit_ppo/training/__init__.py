"""Layer 5, the Lightning side: ``LitPPO`` (the iteration) and its parts (``update``, ``guards``, ``metrics``,
``optim``), ``RolloutDataModule`` (the rollouts as a datamodule), the FSDP2 strategy, and checkpoints written
whole with a record of what made them."""

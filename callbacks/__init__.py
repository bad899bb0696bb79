"""Layer 5 beside ``lit_ppo.training``, the Lightning callbacks of lit_ppo: weight sync to the rollout engine,
completion samples, checkpoints."""

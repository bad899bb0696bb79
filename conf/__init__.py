"""Hydra config groups of lit_ppo (shipped in the package as lit_ppo.conf)."""

"""lit_ppo: a PyTorch Lightning trainer for reinforcement learning of language models (the PPO family)."""

__version__ = "0.1.0"

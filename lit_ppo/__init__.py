"""lit_ppo: a PyTorch Lightning trainer for reinforcement learning of language models (the PPO family).

``lit_ppo.compose`` / ``fit`` / ``sft`` / ``rm`` / ``validate`` / ``test`` / ``export`` are the Python API
(``lit_ppo.api``, docs/python-api.md), loaded on first use: ``import lit_ppo`` and the command line's help load no
torch."""

__version__ = "0.1.0"

API = ("FitResult", "RunConfig", "compose", "export", "fit", "rm", "sft", "test", "validate")
"""The names of ``lit_ppo.api`` that ``lit_ppo`` exposes."""


def __getattr__(name: str):
    if name in API:
        from lit_ppo import api

        return getattr(api, name)
    raise AttributeError(f"module 'lit_ppo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])


__all__ = ["__version__", *API]

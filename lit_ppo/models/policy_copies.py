"""Untrained copies of the policy: the frozen reference of the KL penalty, and a plain transformers
causal LM of its weights (what engines copy and exports write)."""

from __future__ import annotations

import copy

import torch

from lit_ppo.models.cpu_matmul import use_onednn_linears


def model_from_weights(config, weights, dtype: torch.dtype, generation_config=None):
    """A plain transformers causal LM of ``config`` holding ``weights`` (``(name, tensor)`` pairs, e.g.
    gathered from a sharded model, or merged adapters): what engines copy and exports write when the
    trained policy is not such a model itself. Tied weights may come under either name."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in weights:
        if name not in params:
            raise KeyError(f"weight {name!r} is not a parameter of a {type(model).__name__}")
        with torch.no_grad():
            params[name].copy_(tensor)
        loaded.add(name)
    filled = {id(params[name]) for name in loaded}  # a tied weight is filled under any of its names
    missing = sorted(name for name, p in params.items() if id(p) not in filled)
    if missing:
        raise KeyError(f"no weight given for {missing[0]} (and {len(missing) - 1} more)")
    if generation_config is not None:
        model.generation_config = copy.deepcopy(generation_config)
    return use_onednn_linears(model).eval()


def build_reference(policy):
    """A frozen copy of the policy for the KL penalty: eval mode, no parameter requires grad."""
    reference = copy.deepcopy(policy).eval()
    reference.requires_grad_(False)
    return reference

"""LoRA through peft: adapters on the policy (and the critic), the base model as the reference, and
the merged weights that engines and exports load.

Only the adapters train (peft freezes every other weight when it injects them). The model stays a
plain transformers module with peft's LoRA layers inside (``peft.inject_adapter_in_model``, no
``PeftModel`` wrapper), so log-prob and value code runs on it unchanged. Merging is never done in
place: ``merged_weights`` computes ``W + scaling * B @ A`` layer by layer from the live parameters
(merging into W and unmerging again would drift W a little every iteration).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Iterable, Iterator

import torch

from lit_ppo.config import ModelConfig
from lit_ppo.errors import ConfigError
from lit_ppo.models.hf_dir import publish
from lit_ppo.models.policy_copies import model_from_weights

ADAPTER = "default"
"""peft's name of the one adapter lit_ppo trains."""
_LORA_PARTS = ("lora_A", "lora_B")


def lora_config(model_cfg: ModelConfig):
    """peft ``LoraConfig`` of the ``model.lora_*`` settings (``lora_rank`` > 0)."""
    from peft import LoraConfig

    targets = model_cfg.lora_target_modules
    targets = targets if isinstance(targets, str) else list(targets)
    return LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=model_cfg.lora_dropout,
                      target_modules=targets, bias="none")


def add_lora(model: torch.nn.Module, config) -> torch.nn.Module:
    """Inject LoRA adapters (peft ``LoraConfig`` ``config``) into ``model`` in place and return it:
    adapter weights require grad, every other weight is frozen. One-line ConfigError (a ValueError)
    naming ``model.lora_target_modules`` if the targets match nothing or a layer lit_ppo cannot merge:
    which layers a model has is known only once it is loaded."""
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear


    targets = config.target_modules  # peft keeps a list as a set
    where = f"model.lora_target_modules={sorted(targets) if isinstance(targets, (set, frozenset)) else targets!r}"
    try:
        # A copy: peft rewrites target_modules in place ('all-linear' -> this model's module names).
        inject_adapter_in_model(copy.deepcopy(config), model, adapter_name=ADAPTER)
    except ValueError as e:  # peft: no module matched
        reason = str(e).strip().splitlines()[0].split(". ")[0]
        raise ConfigError(f"{where} is invalid for this model: {reason}") from None
    shared = _shared_parameters(model)
    for name, layer in adapted_layers(model).items():
        if not isinstance(layer, Linear):
            raise ConfigError(f"{where} adapts {name} ({type(layer.get_base_layer()).__name__}): only linear "
                              f"layers are supported")
        if id(layer.get_base_layer().weight) in shared:
            raise ConfigError(f"{where} adapts {name}, whose weight is tied to another layer's: LoRA on tied "
                              f"weights is not supported")
    return model


def _shared_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the parameters registered under more than one name (tied weights)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {i for i, n in seen.items() if n > 1}


def adapted_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{module name: peft LoRA layer}`` of ``model`` (empty without adapters)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``add_lora`` gave ``model`` adapters (peft records its config on the model)."""
    return bool(getattr(model, "peft_config", None))


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: the adapters under LoRA, all of them otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside, ``model`` computes as its base model (the reference policy): every LoRA layer passes
    its input through the frozen base layer only, so no second copy of the weights is needed."""
    layers = list(adapted_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)  # peft also makes the adapter weights require grad again


def merged_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]] | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of ``model`` with every adapter merged, under the base model's parameter names.

    ``weights`` is the stream of ``model``'s named full tensors (default: its ``named_parameters``,
    detached); a LoRA layer ``x`` becomes ``x.weight = W + scaling * B @ A`` (transposed for
    fan-in-fan-out layers) once its base weight and both factors have passed, computed in at least
    float32 and cast to W's dtype, and ``x.base_layer.bias`` becomes ``x.bias``. Other tensors pass
    through unchanged, so at most one layer's pieces are held at a time. Dropout plays no part.
    """
    layers = adapted_layers(model)
    if weights is None:
        weights = ((name, p.detach()) for name, p in model.named_parameters())
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        layer_name, part = _lora_part(name, layers)
        if layer_name is None:
            yield name, tensor
            continue
        if part == "bias":
            yield f"{layer_name}.bias", tensor
            continue
        pieces = pending.setdefault(layer_name, {})
        pieces[part] = tensor
        if len(pieces) == 3:
            del pending[layer_name]
            yield f"{layer_name}.weight", _merge(layers[layer_name], **pieces)
    if pending:
        raise RuntimeError(f"merged_weights: the stream lacked pieces of LoRA layers {sorted(pending)}")


def _lora_part(name: str, layers: dict[str, torch.nn.Module]) -> tuple[str | None, str | None]:
    """``(layer name, 'weight' | 'bias' | 'lora_A' | 'lora_B')`` of a parameter of a LoRA layer, else
    ``(None, None)``."""
    for marker in (".base_layer.", *(f".{p}.{ADAPTER}." for p in _LORA_PARTS)):
        layer_name, found, rest = name.partition(marker)
        if found and layer_name in layers:
            return layer_name, rest if marker == ".base_layer." else marker.split(".")[1]
    return None, None


def _merge(layer, weight: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
    """``weight + scaling * lora_B @ lora_A`` of one LoRA layer (the order of peft's own merge)."""
    compute = torch.promote_types(weight.dtype, torch.float32)
    delta = (lora_B.to(compute) @ lora_A.to(compute)) * layer.scaling[ADAPTER]
    if layer.fan_in_fan_out:
        delta = delta.T
    return (weight.to(compute) + delta).to(weight.dtype)


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself without adapters, else a plain transformers model of its config holding
    ``merged_weights(model)`` (``model`` is unchanged): what exports write."""

    if not has_lora(model):
        return model
    dtype = next(model.parameters()).dtype
    return model_from_weights(model.config, merged_weights(model), dtype, getattr(model, "generation_config", None))


def save_adapter(model: torch.nn.Module, base_dir: str | Path, output: str | Path) -> None:
    """Write the adapter of ``model`` to ``output`` in peft's ``save_pretrained`` format (loadable
    with ``PeftModel.from_pretrained(base, output)``); ``base_dir`` is recorded as its base model."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = copy.deepcopy(model.peft_config[ADAPTER])
    config.base_model_name_or_path = str(base_dir)
    config.inference_mode = True  # as PeftModel.save_pretrained writes it
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(output)
    # PeftModel.from_pretrained expects the keys of a PeftModel, whose base model sits under base_model.model.
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    save_file({f"base_model.model.{k}": v.detach().contiguous() for k, v in state.items()},
              output / "adapter_model.safetensors", metadata={"format": "pt"})


def write_adapter_dir(policy, output: str | Path, overwrite: bool = False) -> Path:
    """Write the LoRA adapter of ``policy`` to ``output`` atomically, in peft's format."""
    return publish(output, overwrite, "--adapter", lambda tmp: save_adapter(policy, policy.name_or_path, tmp))

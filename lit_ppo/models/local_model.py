"""A local Hugging Face causal LM: a directory, or the hub id (``org/name``) of a model in the local
Hugging Face cache (``hub_cache_dir``), read offline: where it lies, why it cannot be loaded (checked
before any weight loads), and loading it with its tokenizer."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model is built: the checks read files
    import torch


def _load_dir(path: str | Path, dtype: torch.dtype):
    """Model and tokenizer of a local Hugging Face checkpoint directory (never touches the hub)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model, _load_tokenizer(path)


def _load_tokenizer(path: str | Path):
    """The tokenizer of a local Hugging Face checkpoint directory, padding with EOS where it names no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        # Rows are right-padded and padding is told apart by the attention mask, so reusing EOS is safe.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def looks_like_hub_id(value: str) -> bool:
    """``org/name`` with no other path parts: what a Hugging Face hub id looks like."""
    parts = value.split("/")
    return (len(parts) == 2 and all(parts) and not value.startswith((".", "~"))
            and all(c.isalnum() or c in "-_." for c in value.replace("/", "")))


def hub_cache_dir() -> Path:
    """Where the Hugging Face hub caches models, as huggingface_hub decides it from the environment now:
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache`` by default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def cached_hub_model(source: str) -> Path | None:
    """The snapshot directory of the hub model ``source`` (``org/name``) in the local Hugging Face cache
    (``hub_cache_dir``), which transformers loads offline; None when ``source`` is no hub id or is not cached.
    Reads the cache only, never the network."""
    if not isinstance(source, str) or not looks_like_hub_id(source):
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, cache_dir=hub_cache_dir(), local_files_only=True))
    except Exception:  # not in the cache (LocalEntryNotFoundError), or an unreadable cache entry
        return None


def model_source_dir(source: str) -> Path:
    """The directory that the model source ``source`` (a local directory or a cached hub id) is read from."""
    path = Path(source).expanduser()
    return path if path.is_dir() else cached_hub_model(source) or path


HEADS = {"causal": ("a causal LM", ("ForCausalLM", "LMHeadModel")),
         "classifier": ("a sequence classifier", ("ForSequenceClassification",))}
"""What a model directory is loaded as -> (its name in messages, the architecture name endings it may have)."""


def _auto_class(head: str):
    """The transformers Auto class that loads a directory as ``head`` (a key of ``HEADS``)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForCausalLM if head == "causal" else AutoModelForSequenceClassification


def model_files_problem(path: str | Path) -> str | None:
    """Why the local directory or cached hub model ``path`` is no Hugging Face model directory (no such
    directory, no config.json, no tokenizer file), or None: what ``model_dir_problem`` checks first, from
    the directory listing alone."""
    given = str(path)
    path = model_source_dir(given)
    if not path.is_dir():
        if looks_like_hub_id(given):
            return (f"is neither a local directory nor in the Hugging Face cache ({hub_cache_dir()}): download "
                    f"it first with: hf download {given}")
        return "is not a directory"
    if not (path / "config.json").is_file():
        return "has no config.json: must be a Hugging Face model directory"
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        return f"has no tokenizer (none of {', '.join(_TOKENIZER_FILES)})"
    return None


def model_dir_problem(path: str | Path, head: str = "causal") -> str | None:
    """Why the local directory or cached hub model ``path`` cannot be loaded as ``head`` (a causal LM, or a
    sequence classifier such as a reward model), or None. Reads its config.json through transformers (no
    weights are loaded)."""
    problem = model_files_problem(path)
    if problem is not None:
        return problem
    path = model_source_dir(str(path))
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # an unknown model_type, malformed JSON, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"has a config.json transformers cannot read ({reason})"
    kind, endings = HEADS[head]
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if head == "causal" else MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    architectures = getattr(config, "architectures", None) or []
    if architectures:  # what the checkpoint was saved as decides (a BERT for masked LM is not causal)
        is_head = any(a.endswith(endings) or a in set(mapping.values()) for a in architectures)
    else:
        is_head = config.model_type in mapping
    causal_endings = HEADS["causal"][1]
    if not is_head and head == "classifier" and any(a.endswith(causal_endings) for a in architectures):
        return f"is a causal LM (config.json's architectures: {', '.join(architectures)}), not a sequence classifier"
    if not is_head:
        return (f"is not {kind} (model_type {config.model_type!r}, architectures "
                f"{', '.join(architectures) or 'none'})")
    problem = weights_problem(path, config, head)
    if (problem is not None and head == "classifier" and not architectures
            and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and weights_problem(path, config) is None):
        # A config that names no class (saved from the config alone) over a causal LM's weights.
        return (f"is a causal LM (its weights are a {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]}'s, and "
                f"config.json names no architectures), not a sequence classifier")
    return problem


SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
"""Weight files transformers also loads; they cannot be inspected without unpickling, so they are
checked when they load."""


def weights_problem(path: str | Path, config, head: str = "causal") -> str | None:
    """Why the weights of the model directory ``path`` cannot be the model its ``config`` describes, or
    None: no weight file, a shard that its index lists missing, a safetensors file cut short, or a
    tensor missing or of another shape than the config gives it. Reads the safetensors headers only
    (the expected shapes come from the model built on the meta device: no memory, no weights)."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif (path / SAFETENSORS_INDEX).is_file():
        try:
            weight_map = json.loads((path / SAFETENSORS_INDEX).read_text(encoding="utf-8"))["weight_map"]
            files = sorted({path / name for name in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return f"has a {SAFETENSORS_INDEX} that is not a weight index ({type(e).__name__}: {e})"
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            return (f"is missing {absent[0]}" + (f" and {len(absent) - 1} more weight file(s)" if len(absent) > 1
                                                 else "") + f", listed in its {SAFETENSORS_INDEX}")
    elif any((path / name).is_file() for name in PICKLED_WEIGHTS):
        return None
    else:
        return (f"has no weights (none of model.safetensors, {SAFETENSORS_INDEX}, "
                f"{', '.join(PICKLED_WEIGHTS)})")
    shapes: dict[str, list[int]] = {}
    for file in files:
        header = _safetensors_header(file)
        if isinstance(header, str):
            return f"has a damaged weight file: {file.name} {header}"
        shapes.update(header)
    return _shape_problem(shapes, config, head)


def _safetensors_header(file: Path) -> dict[str, list[int]] | str:
    """``{tensor name: shape}`` of a safetensors file, or why it is not a complete one (its header
    says where every tensor's bytes lie: a file shorter than that was cut short)."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else None
        if length is None or length > size - 8:
            return f"is truncated ({size} bytes, less than its header)"
        try:
            header = json.loads(f.read(length))
            tensors = {name: info for name, info in header.items() if name != "__metadata__"}
            end = max((int(info["data_offsets"][1]) for info in tensors.values()), default=0)
            shapes = {name: [int(n) for n in info["shape"]] for name, info in tensors.items()}
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return "is not a safetensors file (its header does not describe tensors)"
    if 8 + length + end > size:
        return f"is truncated ({size} bytes of the {8 + length + end} its header describes)"
    return shapes


def _shape_problem(shapes: dict[str, list[int]], config, head: str) -> str | None:
    """The first weight of the model ``config`` describes (as ``head``) that ``shapes`` (the checkpoint's
    tensors) lacks or holds in another shape; None if the model cannot be built here (the load then tells)."""
    import torch

    try:
        with torch.device("meta"):
            model = _auto_class(head).from_config(config)
    except Exception:
        return None
    prefix = f"{model.base_model_prefix}." if model.base_model_prefix else ""

    def stored(name: str) -> str | None:
        """The checkpoint's name of the model's weight ``name`` (base models are saved without the prefix)."""
        if name in shapes:
            return name
        bare = name.removeprefix(prefix)
        return bare if bare != name and bare in shapes else None

    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers())
    if not any(stored(name) for name in tensors):
        return None  # another naming scheme, which transformers converts when it loads
    by_storage: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_storage.setdefault(id(param), []).append(name)
    optional = [re.compile(pattern) for pattern in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]
    for names in by_storage.values():  # tied weights: one stored name suffices
        if not any(stored(name) for name in names) and not any(p.search(n) for p in optional for n in names):
            return f"lacks the weight {names[0]} that config.json's {type(model).__name__} has"
    for name, tensor in tensors.items():
        key = stored(name)
        if key is not None and list(tensor.shape) != shapes[key]:
            return (f"has the weight {key} of shape {shapes[key]}, but config.json's {type(model).__name__} "
                    f"needs {list(tensor.shape)} (a config.json of another model size?)")
    return None

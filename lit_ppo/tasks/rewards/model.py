"""A reward model as a reward: a local ``AutoModelForSequenceClassification`` directory given in
``reward_fns`` where a function goes (TRL's form: a path in ``reward_funcs``).

Each completion is shown to the model as TRL shows it: the prompt and the completion as one conversation
(``[user prompt, assistant completion]``, or the prompt's own messages then the completion) rendered by
the reward model's own chat template, or, for a tokenizer without one, the prompt text followed by the
completion text; tokenised with the reward model's tokenizer without added special tokens, right-padded,
the oldest tokens cut where a text is longer than ``max_length``. The reward is the logit of the model's
one label (``label`` for a classifier with several), normalised as ``(logit - mean) / std`` and then
squashed by ``squash`` if set.

Calls are batched across the batch's prompt groups (``BatchedCalls``): the texts of the calls that
``score_calls`` awaits together are scored at once, ``batch_size`` per forward pass, off the event loop.
The weights load at the first scoring, on ``device`` in ``dtype``; with ``offload`` they wait in CPU memory
between scorings, so that an accelerator holds them only while they score.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lit_ppo.config.checks import check_choice, check_fields, check_number, check_positive_int, fail
from lit_ppo.config.model import recorded_reward_statistics
from lit_ppo.tasks.rewards.batching import BatchedCalls
from lit_ppo.tasks.rewards.calls import completion_text

if TYPE_CHECKING:  # torch and the models load where a model loads or scores: a task is built without them
    import torch

SQUASHES = ("sigmoid", "tanh")
"""``squash`` names: the torch function of that name is applied to the normalised logit."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``dtype`` choices: as the directory stores it, or one of these."""


@dataclass
class RewardModelConfig:
    """How the reward model directories of ``reward_fns`` load and score (``data.task_kwargs.reward_model``)."""

    device: str = "auto"
    """Where the model scores: ``auto`` (this rank's CUDA device if there is one, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N``."""
    dtype: str = "auto"
    """Its weights' dtype: ``auto`` (as the directory stores them), ``float32``, ``bfloat16`` or ``float16``."""
    batch_size: int = 32
    """Texts per forward pass."""
    max_length: int | None = None
    """The most tokens of a text the model sees; a longer one keeps its last ``max_length`` (the completion's
    end). None: the model's ``max_position_embeddings``."""
    label: int | None = None
    """For a classifier with several labels: the one whose logit is the reward. None: the model must have
    one label (``num_labels=1``, as TRL's RewardTrainer saves it)."""
    mean: float | None = None
    """Subtracted from the logit (with ``std``: the scores' mean and spread on your data, as OpenRLHF's
    normalised reward models store them). None: the mean that the directory records, as ``python -m lit_ppo
    rm`` writes it (its rewards over its training pairs), else 0."""
    std: float | None = None
    """The logit minus ``mean`` is divided by it. None: the spread that the directory records, else 1."""
    squash: str | None = None
    """``sigmoid`` (a score in (0, 1)), ``tanh`` (in (-1, 1)) or None (the normalised logit as it is)."""
    offload: bool = False
    """Keep the weights in CPU memory between scorings, on ``device`` only while they score: an accelerator
    then holds them during generation and training no longer. No effect with ``device=cpu``."""


def is_model_path(name: str) -> bool:
    """Whether the ``reward_fns`` entry ``name`` names a model directory (or hub id) rather than a function:
    it holds a ``/``, or it is an existing directory."""
    return "/" in name or os.sep in name or Path(name).expanduser().is_dir()


def check_device(key: str, name: str) -> None:
    """ValueError in one line naming the setting ``key`` unless ``name`` is ``auto``, ``cpu``, ``cuda`` or
    ``cuda:N``, the last two on a machine with CUDA (only they load torch, to ask)."""
    if name == "auto":
        return
    if not isinstance(name, str) or not re.fullmatch(r"(cpu|cuda)(:\d+)?", name):
        fail(key, name, "auto, cpu, cuda or cuda:N")
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"{key}={name!r}: this machine has no CUDA device; use auto or cpu")


def model_device(key: str, name: str) -> torch.device:
    """The device the setting ``key`` names (``check_device``): ``auto`` is this rank's CUDA device if there
    is one, else the CPU."""
    import torch

    check_device(key, name)
    if name == "auto":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _settings(values: dict[str, Any] | None, where: str) -> RewardModelConfig:
    """``values`` as a checked RewardModelConfig; ValueError naming ``where.<field>`` and what is allowed."""
    if values is None:
        return RewardModelConfig()
    allowed = [f.name for f in dataclasses.fields(RewardModelConfig)]
    if not isinstance(values, dict):
        fail(where, values, f"a mapping of {', '.join(allowed)}, or null")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a setting of a reward model: allowed: {', '.join(allowed)}")
    cfg = RewardModelConfig(**values)
    check_fields(cfg, where)
    check_device(f"{where}.device", cfg.device)
    check_choice(f"{where}.dtype", cfg.dtype, DTYPES)
    check_positive_int(f"{where}.batch_size", cfg.batch_size)
    check_positive_int(f"{where}.max_length", cfg.max_length, optional=True)
    if cfg.label is not None and cfg.label < 0:
        fail(f"{where}.label", cfg.label, "a label index >= 0, or null")
    check_number(f"{where}.mean", cfg.mean, optional=True)
    check_number(f"{where}.std", cfg.std, low=0, low_open=True, optional=True)
    if cfg.squash is not None:
        check_choice(f"{where}.squash", cfg.squash, SQUASHES)
    return cfg


def reward_model_text(tokenizer, prompt: Any, completion: Any) -> str:
    """What a reward model with ``tokenizer`` reads for ``completion`` of ``prompt`` (a string, or chat
    messages; see the module docstring): what it is trained on and what it scores."""
    reply = completion_text(completion)
    if not tokenizer.chat_template:
        shown = prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
        return shown + reply
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    return tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": reply}], tokenize=False)


class RewardModel:
    """A sequence-classification model directory scoring completions, called as a reward function.

    Args:
        path: the model directory (or the hub id of one in the local Hugging Face cache).
        settings: how it loads and scores.
    """

    def __init__(self, path: str, settings: RewardModelConfig):
        from lit_ppo.models.local_model import model_source_dir

        self.path = model_source_dir(path)
        self.settings = settings
        self.__name__ = Path(path).name
        self._model = None
        self._tokenizer = None
        self._device: torch.device | None = None
        """Where it scores, resolved as it loads."""
        self._load_lock = threading.RLock()  # the model loads the tokenizer under it too
        self._batched = BatchedCalls(self._scores)

    @classmethod
    def from_settings(cls, path: str, settings: dict[str, Any] | None, where: str, settings_key: str) -> RewardModel:
        """The reward model at ``path`` (the setting ``where``) with the settings of ``settings_key``;
        ValueError in one line for a directory that is not a sequence classifier with one label (or with the
        label ``label``), or for bad settings. Reads config.json and the weights' headers only."""
        from lit_ppo.models.local_model import model_dir_problem, model_source_dir

        cfg = _settings(settings, settings_key)
        problem = model_dir_problem(path, head="classifier")
        if problem is not None:
            raise ValueError(f"{where}={path!r} {problem}: a reward model directory holds a sequence classifier, "
                             f"as TRL's RewardTrainer saves it (config.json's architectures such as "
                             f"LlamaForSequenceClassification, and the weights of its score head)")
        from transformers import AutoConfig

        labels = AutoConfig.from_pretrained(model_source_dir(path), local_files_only=True).num_labels
        if cfg.label is None and labels != 1:
            raise ValueError(f"{where}={path!r} has {labels} labels: set {settings_key}.label to the one whose logit "
                             f"is the reward (0 to {labels - 1})")
        if cfg.label is not None and cfg.label >= labels:
            raise ValueError(f"{settings_key}.label={cfg.label} is invalid for {path!r}: it has {labels} label(s), "
                             f"0 to {labels - 1}")
        recorded = recorded_reward_statistics(model_source_dir(path))
        return cls(path, dataclasses.replace(cfg, mean=recorded.get("mean", 0.0) if cfg.mean is None else cfg.mean,
                                             std=recorded.get("std", 1.0) if cfg.std is None else cfg.std))

    def __call__(self, prompts: list, completions: list, **kwargs: Any):
        """An awaitable of the completions' rewards (see the module docstring)."""
        return self._batched([self._text(p, c) for p, c in zip(prompts, completions, strict=True)])

    # ------------------------------------------------------------------ texts

    def _loaded_tokenizer(self):
        with self._load_lock:
            if self._tokenizer is None:
                from transformers import AutoConfig, AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
                # The model finds each row's last token by its pad id: pad with the one it was saved with.
                saved = AutoConfig.from_pretrained(self.path, local_files_only=True).pad_token_id
                if saved is not None:
                    tokenizer.pad_token_id = saved
                elif tokenizer.pad_token is None:
                    tokenizer.pad_token = tokenizer.eos_token
                tokenizer.padding_side = "right"
                tokenizer.truncation_side = "left"  # a long text keeps the completion's end
                self._tokenizer = tokenizer
            return self._tokenizer

    def _text(self, prompt: Any, completion: Any) -> str:
        """What the model reads for one completion (see the module docstring)."""
        return reward_model_text(self._loaded_tokenizer(), prompt, completion)

    # ------------------------------------------------------------------ the model

    def _loaded_model(self):
        with self._load_lock:
            if self._model is None:
                import torch
                from transformers import AutoModelForSequenceClassification

                self._device = model_device("device", self.settings.device)
                dtype = "auto" if self.settings.dtype == "auto" else getattr(torch, self.settings.dtype)
                model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype,
                                                                           local_files_only=True)
                model.config.pad_token_id = self._loaded_tokenizer().pad_token_id
                model.requires_grad_(False).eval()
                self._model = model.to("cpu" if self.settings.offload else self._device)
            return self._model

    def _scores(self, texts: list[str]) -> list[float]:
        """The rewards of ``texts``, ``batch_size`` per forward pass."""
        import torch

        model, tokenizer, cfg = self._loaded_model(), self._loaded_tokenizer(), self.settings
        max_length = cfg.max_length or getattr(model.config, "max_position_embeddings", None)
        if cfg.offload:
            model.to(self._device)
        try:
            logits = []
            with torch.inference_mode():
                for start in range(0, len(texts), cfg.batch_size):
                    inputs = tokenizer(texts[start:start + cfg.batch_size], return_tensors="pt", padding=True,
                                       truncation=max_length is not None, max_length=max_length,
                                       add_special_tokens=False).to(self._device)
                    logits.append(model(**inputs).logits[:, cfg.label or 0].float().cpu())
        finally:
            if cfg.offload:
                model.to("cpu")
                if self._device.type == "cuda":
                    torch.cuda.empty_cache()
        scores = (torch.cat(logits) - cfg.mean) / cfg.std
        return (scores if cfg.squash is None else getattr(torch, cfg.squash)(scores)).tolist()

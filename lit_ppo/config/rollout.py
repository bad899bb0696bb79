"""How a rank's rollouts are made: the engine and its settings, the batch and its filter, the episodes, and
the bounds the trainer holds the rollouts to (``RolloutDataModule``'s arguments besides the task, the
generation and the evaluation configs).

The keys keep the names the command line gives them: ``data.*``, and the rollout group's ``rollout.*``
(``lit_ppo.config.keys.ROLLOUT_KEYS``); every error names its key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from lit_ppo.config.checks import check_choice, check_positive_int, check_value, fail, is_number, type_hints
from lit_ppo.config.keys import typed_key
from lit_ppo.config.model import DTYPES

ENGINES = ("hf", "vllm")
"""Rollout engines: 'hf' (transformers, ``lit_ppo.rollout.engines.hf``) or 'vllm' (``lit_ppo.rollout.engines.vllm``)."""
HF_ENGINE_KWARGS = ("max_batch_size", "dtype", "autocast")
"""The settings of the HF engine (``rollout.engine_kwargs`` of ``rollout=hf``)."""
TOOL_FORMATS = ("auto", "hermes", "json")
"""How an agent's client writes tool calls (``lit_ppo.rollout.episodes.tool_calls``); 'auto' reads it off the chat
template."""
DRIFT_RULES = ("share", "last", "error")
"""What an agent's call whose chat template re-renders the earlier turns differently does (``data.on_drift``)."""
INVALID_REWARD_ACTIONS = ("error", "drop")
"""What a workflow does with a reward that is not a finite real number: raise, or record NaN so that
the collector drops the row's whole group."""


def precision_problem(dtype: Any, autocast: Any, prefix: str = "") -> str | None:
    """Why ``dtype`` / ``autocast`` are invalid settings of the HF engine (None if they are valid);
    ``prefix`` precedes the names (``rollout.engine_kwargs.``)."""
    if dtype not in (None, "auto", *DTYPES):
        return f"{prefix}dtype={dtype!r} is invalid: must be one of 'auto', {', '.join(map(repr, DTYPES))} or null"
    if autocast not in (None, "bfloat16", "float16"):
        return f"{prefix}autocast={autocast!r} is invalid: must be 'bfloat16', 'float16' or null"
    return None


@dataclass
class RolloutConfig:
    """How a rank's rollouts are made and the bounds the trainer holds them to."""

    engine: str = "hf"
    """Rollout engine, 'hf' (transformers) or 'vllm' (``data.engine``, typed ``rollout.engine``)."""
    engine_kwargs: dict | None = None
    """Keyword arguments of the engine (e.g. vllm's gpu_memory_utilization, max_model_len; for 'hf':
    max_batch_size, dtype, autocast, checked here). Both take ``dtype`` ('bfloat16': the engine's weights
    in bf16). Under ``trainer.precision=bf16-mixed`` / ``16-mixed`` the HF engine autocasts as the trainer
    does (``autocast`` overrides it), on every thread. None: no settings (a mapping once constructed)."""
    batch_size: int = 32
    """Prompt groups per RL iteration and rank."""
    dynamic_filter_fn: str | None = None
    """Dotted path to ``fn(group: RolloutBatch) -> bool`` accepting a prompt's group (e.g.
    lit_ppo.rollout.filters.mixed_outcomes, DAPO's 0 < mean reward < 1); None keeps all."""
    dynamic_bs: bool = False
    """Stop after ``batch_size`` groups were tried and train on the accepted ones (the batch may be
    smaller, or empty: the iteration is then skipped); otherwise keep sampling until ``batch_size``
    groups are accepted."""
    max_attempts_factor: int = 8
    """Give up, with an error naming the filter, after ``max_attempts_factor * batch_size`` groups were
    tried for one batch (fixed batch size) or after ``max_attempts_factor`` consecutive empty batches
    (dynamic_bs)."""
    system_prompt: str | None = None
    """Optional system message before every prompt."""
    seed: int = 0
    """Seed of the prompt order and of sampling."""
    max_turns: int = 4
    """Most assistant turns per episode of a multi-turn task (one with ``environment(problem)``, e.g.
    'calculator'); ignored by single-turn tasks."""
    turn_discount: float = 1.0
    """Factor in (0, 1] applied to a multi-turn episode's reward once per assistant turn after the first;
    for an agent that rewards each call, a call's return is its reward plus this times the next call's
    return. Ignored by single-turn tasks."""
    episodes_in_flight: int = 32
    """Most episodes of an agent task (``data=agent``) played at once on a rank; the calls they make
    at the same time are sampled in one engine call. Ignored by other tasks."""
    episode_timeout_s: float = 300.0
    """Seconds an agent's episode may take; one that runs past it fails (``on_invalid_reward`` decides)."""
    tool_format: str = "auto"
    """How an agent's client writes and reads tool calls: 'hermes' (``<tool_call>{json}</tool_call>``,
    Hermes / Qwen), 'json' (the reply is the JSON call) or 'auto' (hermes where the chat template writes
    ``<tool_call>``, else json)."""
    on_drift: str = "share"
    """An agent's call whose chat template renders the earlier turns differently (a reasoning model dropping
    past thinking), or whose history the agent trimmed or rewrote, starts a sample of its own, counted in
    ``rollout/drifted_calls``. 'share': the sample it drifted from is kept and every sample of
    the episode carries the episode's reward; 'last': the sample it drifted from is not trained on; 'error':
    the run stops, naming the agent and the problem."""
    on_invalid_reward: str = "error"
    """A reward that is not a finite real number (NaN, inf, None, a string) fails the iteration with an
    error naming the task, the prompt and the value ('error'), or drops that prompt's whole group
    ('drop'), counted in ``rollout/invalid_rewards``; dropped groups count as tried for ``dynamic_bs``
    and ``max_attempts_factor``."""
    max_logp_gap: float | Literal["auto"] | None = "auto"
    """Largest mean |behaviour - trainer| log-prob gap, in nats per token, allowed on the tokens of a batch
    sampled by the current policy version: above it the run stops before any optimizer step on that
    batch. In synchronous training that is every token. The error names the engine, which is then not
    sampling from the trainer's weights. The gap is measured by the trainer's recompute pass
    (``actor.recompute_logprob`` or the decoupled loss) or else by the first minibatch's forward pass, as
    the token mean over all ranks. 'auto': 1e-3 where engine and trainer compute in float32, 0.1 where
    either computes in lower precision (``model.dtype`` or ``rollout.engine_kwargs.dtype`` not float32,
    ``trainer.precision`` not 32); a number replaces both; None (null) disables the check
    (``lit_ppo.training.guards.LogpGapCheck``). The measured gaps and what the error recommends:
    docs/rollout.md#the-log-prob-gap."""
    max_head_offpolicyness: int = 0
    """k, how many policy versions a trained token may lag the policy that trains on it. 0: synchronous
    (each batch is generated by the current weights, then trained on). k > 0: a producer thread
    generates batches ahead while the trainer trains (``lit_ppo.rollout.producer``), starting one only
    while at most k batches are waiting or in training; each token keeps the version that sampled it, a
    group older than k versions at hand-over is dropped (``rollout/dropped_stale``), and the actor needs
    the decoupled loss (``actor.use_decoupled_loss``, e.g. algo=icepop). The engine then stays awake
    during the update (on a GPU it shares the device's memory with the trainer, or takes ``devices``)."""
    num_threads: int | None = None
    """With k > 0, the torch CPU threads of the producer thread; the trainer keeps the rest of the
    process's threads (at least one). None: half of them (at least one)."""
    devices: list[int] | None = None
    """CUDA device indices for the rollout engines, the one at position ``local_rank`` for each rank of
    a node (``rollout=hf`` only); None: each engine on its rank's own device."""

    def __post_init__(self):
        # Each field against its declared type first, named as the command line types it (rollout.* for
        # the rollout group's keys): the errors of the command line's own check of RolloutDataModule's
        # arguments. Then the values, in the order of those arguments.
        hints = type_hints(type(self))
        for f in fields(self):
            check_value(typed_key(f"data.{f.name}"), getattr(self, f.name), hints[f.name])
        check_choice("data.engine", self.engine, ENGINES)
        check_positive_int("data.batch_size", self.batch_size)
        check_positive_int("data.max_attempts_factor", self.max_attempts_factor)
        check_positive_int("data.max_turns", self.max_turns)
        if not is_number(self.turn_discount) or not 0.0 < self.turn_discount <= 1.0:
            fail("data.turn_discount", self.turn_discount, "a number in (0, 1]")
        check_choice("data.on_invalid_reward", self.on_invalid_reward, INVALID_REWARD_ACTIONS)
        check_positive_int("data.episodes_in_flight", self.episodes_in_flight)
        if not self.episode_timeout_s > 0:
            fail("data.episode_timeout_s", self.episode_timeout_s, "a number of seconds > 0")
        check_choice("data.tool_format", self.tool_format, TOOL_FORMATS)
        check_choice("data.on_drift", self.on_drift, DRIFT_RULES)
        if self.max_logp_gap not in (None, "auto"):
            if not self.max_logp_gap > 0:
                fail("rollout.max_logp_gap", self.max_logp_gap, "a positive number, 'auto' or null")
            self.max_logp_gap = float(self.max_logp_gap)
        if self.max_head_offpolicyness < 0:
            fail("rollout.max_head_offpolicyness", self.max_head_offpolicyness, "an integer >= 0 (0: synchronous)")
        check_positive_int("rollout.num_threads", self.num_threads, optional=True)
        self._check_devices()
        self._check_engine_kwargs()
        self.engine_kwargs = dict(self.engine_kwargs or {})
        self.devices = None if self.devices is None else list(self.devices)

    def _check_devices(self) -> None:
        devices = self.devices
        if devices is None:
            return
        if not devices or min(devices) < 0:
            fail("rollout.devices", devices, "a list of CUDA device indices or null")
        if self.engine != "hf":
            raise ValueError(f"rollout.devices needs rollout=hf: the {self.engine} engine shares its rank's device")
        import torch  # here only: the config layer loads without torch (help, composition)

        available = torch.cuda.device_count()
        if max(devices) >= available:
            raise ValueError(f"rollout.devices={list(devices)}: this machine has {available} CUDA device(s)")

    def _check_engine_kwargs(self) -> None:
        """The settings of rollout=hf's engine (vLLM checks its own when it starts)."""
        kwargs = self.engine_kwargs
        if self.engine != "hf" or not kwargs:
            return
        for name in kwargs:
            if name not in HF_ENGINE_KWARGS:
                raise ValueError(f"rollout.engine_kwargs.{name} is not a setting of rollout=hf; allowed: "
                                 f"{', '.join(sorted(HF_ENGINE_KWARGS))}")
        check_positive_int("rollout.engine_kwargs.max_batch_size", kwargs.get("max_batch_size", 1))
        problem = precision_problem(kwargs.get("dtype"), kwargs.get("autocast"), "rollout.engine_kwargs.")
        if problem:
            raise ValueError(problem)


DATA_SECTIONS = ("gconfig", "eval")
"""The data section's keys that are configs of their own (GenerationConfig, EvalConfig)."""
DATA_KEYS = ("task", "task_kwargs", *DATA_SECTIONS, *(f.name for f in fields(RolloutConfig)))
"""The keys of the data section, RolloutDataModule's arguments: the task and its keyword arguments, the
generation and evaluation configs and every RolloutConfig field (known without importing the module)."""
DATA_TYPES = {"task": str, "task_kwargs": dict | None, **type_hints(RolloutConfig)}
"""The type of each key of the data section but the configs of their own (``DATA_SECTIONS``), as
RolloutDataModule declares it: checked before the task is built, without Lightning."""

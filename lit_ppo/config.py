"""Algorithm configuration: the one schema for presets, Hydra and LightningCLI.

Field names, types and defaults follow AReaL (docs/algorithms.md#differences-from-areal); every field is validated in
``__post_init__``, against its declared type (``check_fields``, shared by every config section) and then
its range, and an error names the field, the bad value and what is allowed.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import types
import typing
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, Union

from lit_ppo.utils.text import did_you_mean

NORM_LEVELS = ("batch", "group", None)
REJECTION_LEVELS = ("token", "sequence")
REJECTION_ACTIONS = ("mask", "clamp")
REJECTION_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")
REJECTION_AGGS = ("mean", "sum", "max")
KL_ESTIMATORS = ("k1", "k2", "k3")
GAE_UNITS = ("token", "turn")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

ROLLOUT_KEYS = ("engine", "engine_kwargs", "max_logp_gap", "max_head_offpolicyness", "num_threads", "devices")
"""The rollout group's keys: RolloutDataModule arguments under their own names (rollout.engine -> data.engine)."""
LIGHTNING_NAMES = (("model.actor", "actor"), ("model.critic", "critic"), ("model.model", "model"),
                   ("model.algo", "algo"), ("data.gconfig", "gconfig"), ("data.eval", "eval"),
                   *((f"data.{key}", f"rollout.{key}") for key in ROLLOUT_KEYS),
                   ("trainer.logger", "logger"), ("seed_everything", "seed"))
"""Section of LightningCLI's tree (what ``--print_config`` shows) -> the key typed on the command line."""


def typed_key(key: str) -> str:
    """The command line's name of LightningCLI's dotted ``key``: ``model.actor.eps_clip`` -> ``actor.eps_clip``,
    ``data.engine`` -> ``rollout.engine``, ``trainer.logger.init_args.run_name`` -> ``logger.init_args.run_name``."""
    for lightning, typed in LIGHTNING_NAMES:
        if key == lightning or key.startswith(lightning + "."):
            return typed + key[len(lightning):]
    return key


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is invalid: must be {allowed}")


# ---------------------------------------------------------------------------------------------
# declared types: every field of every config section is checked against its type hint here
# ---------------------------------------------------------------------------------------------

_SINGULAR = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
_PLURAL = {bool: "true or false values", int: "integers", float: "numbers", str: "strings"}


@functools.lru_cache(maxsize=None)
def type_hints(owner: Any) -> dict[str, Any]:
    """The resolved type hints of a dataclass or a function (``from __future__`` annotations are text)."""
    hints = typing.get_type_hints(owner)
    hints.pop("return", None)
    return hints


def _members(hint: Any) -> tuple:
    """The alternatives of a union (``X | Y``, ``Optional[X]``), else ``(hint,)``."""
    return typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)


def _unchecked(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return hint is Any or origin is collections.abc.Callable or isinstance(hint, (typing.TypeVar, str))


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value``, as YAML / Hydra / Python gives it, is of type ``hint``."""
    if _unchecked(hint):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, member) for member in args)
    if origin is Literal:  # 1 == True: compare the type too
        return any(type(value) is type(choice) and value == choice for choice in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return not args or all(_matches(item, args[0]) for item in value)
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        key_hint, value_hint = args or (Any, Any)
        return all(_matches(k, key_hint) and _matches(v, value_hint) for k, v in value.items())
    if is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return True
        hints = type_hints(hint)
        return (isinstance(value, collections.abc.Mapping) and set(value) <= set(hints)
                and all(_matches(v, hints[k]) for k, v in value.items()))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a typing construct without a runtime check


def _join(words: list[str]) -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def describe(hint: Any, plural: bool = False) -> str:
    """What ``hint`` allows, in words: ``bool | None`` -> "true, false or null"."""
    members = _members(hint)
    if len(members) > 1:
        words: list[str] = []
        for member in members:
            words += ["true", "false"] if member is bool else [describe(member, plural)]
        return _join(words)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SINGULAR:
        return (_PLURAL if plural else _SINGULAR).get(hint, "null")
    if origin is Literal:
        return ("one of " if len(args) > 1 else "") + _join([repr(a) for a in args])
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        inner = "" if not args or _unchecked(args[0]) else " of " + describe(args[0], plural=True)
        return ("lists" if plural else "a list") + inner
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        inner = "" if not args or _unchecked(args[1]) else f" of {describe(args[0], True)} to {describe(args[1], True)}"
        return ("mappings" if plural else "a mapping") + inner
    if is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


def check_value(name: str, value: Any, hint: Any) -> None:
    """ValueError ``<name>=<value!r> is invalid: must be <what hint allows>`` unless ``value`` is of
    type ``hint`` (bool only true / false, int not bool, float also int; Any and callables unchecked)."""
    if not _matches(value, hint):
        _fail(name, value, describe(hint))


def check_fields(config: Any, section: str = "") -> None:
    """Check every field of the dataclass instance ``config`` against its declared type; errors name
    ``<section>.<field>`` (the bare field without a section)."""
    hints = type_hints(type(config))
    for f in fields(config):
        check_value(f"{section}.{f.name}" if section else f.name, getattr(config, f.name), hints[f.name])


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        _fail(name, value, "one of " + ", ".join(repr(c) for c in choices))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(name: str, value: Any, *, low: float | None = None, low_open: bool = False,
                  high: float | None = None, optional: bool = False) -> None:
    """Finite number within [low, high] (or (low, high] when ``low_open``)."""
    if value is None and optional:
        return
    lo = "" if low is None else (f" > {low}" if low_open else f" >= {low}")
    hi = "" if high is None else f" <= {high}"
    allowed = "a finite number" + (lo + (" and" if lo and hi else "") + hi if lo or hi else "")
    if optional:
        allowed += " or null"
    if not _is_number(value) or not math.isfinite(value):
        _fail(name, value, allowed)
    if low is not None and (value <= low if low_open else value < low):
        _fail(name, value, allowed)
    if high is not None and value > high:
        _fail(name, value, allowed)


def _check_positive_int(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(name, value, "a positive integer" + (" or null" if optional else ""))


def _as_config(cls: type, name: str, value: Any):
    """Nested configs arrive as dataclasses, mappings (YAML / Hydra) or None; an error of the nested
    config names its key under ``name`` (``reward_norm.eps``, ``critic.optimizer.lr``)."""
    if value is None or isinstance(value, cls) or not isinstance(value, collections.abc.Mapping):
        return value  # check_fields judges what is neither a config nor a mapping
    allowed = [f.name for f in fields(cls)]
    for key in value:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed, prefix=f"{name}.")
            raise ValueError(f"{name}.{key} is not a key{hint}; allowed: {', '.join(allowed)}")
    try:
        return cls(**value)
    except ValueError as e:
        message = str(e)
        parent, _, last = name.rpartition(".")
        if not message.startswith(last + "."):  # NormConfig's keys carry no section of their own
            message = f"{last}.{message}"
        raise ValueError(f"{parent}.{message}" if parent else message) from None


@dataclass
class NormConfig:
    """Normalisation of rewards ``[B]`` or advantages ``[B, T]`` (docs/algorithms.md#normalisation)."""

    mean_level: str | None = "batch"
    """Mean subtracted: 'batch' (whole batch, all ranks), 'group' (per prompt group) or None (no centring)."""
    mean_leave1out: bool = False
    """Leave-one-out mean: each element is centred on the mean of the others (RLOO baseline)."""
    std_level: str | None = "batch"
    """Std divided by, computed around the chosen mean: 'batch', 'group', or None (divide by 1, eps 0)."""
    std_unbiased: bool = True
    """Bessel correction (n - 1) for the std."""
    eps: float = 1e-5
    """Added to the std (not the variance) before dividing."""
    group_size: int = 1
    """Group size used only when the batch carries no group sizes; must then divide the batch size."""

    def __post_init__(self):
        check_fields(self)
        _check_choice("mean_level", self.mean_level, NORM_LEVELS)
        _check_choice("std_level", self.std_level, NORM_LEVELS)
        _check_number("eps", self.eps, low=0.0)
        _check_positive_int("group_size", self.group_size)


@dataclass
class RejectionSamplingConfig:
    """Train/inference mismatch filter on the behaviour weight pi_prox / pi_behave (IcePop, KPop)."""

    level: str = "token"
    """'token': judge each token; 'sequence': judge the aggregate of each sequence and keep/drop it whole."""
    action: str = "mask"
    """'mask': drop out-of-bound tokens/sequences from the loss; 'clamp': truncate the weight (ratio only)."""
    metric: str = "ratio"
    """Per-token mismatch measure: 'ratio' (pi_prox/pi_behave), 'kl_k1', 'kl_k2', 'kl_k3', or 'binary_kl' (KPop)."""
    agg: str = "mean"
    """Sequence aggregation of the metric ('ratio' in log space): 'mean', 'sum' or 'max'. Sequence level only."""
    upper: float = 5.0
    """Upper bound, inclusive (metric <= upper is kept)."""
    lower: float | None = None
    """Lower bound, inclusive, or None for none (clamp sets 0.0)."""

    def __post_init__(self):
        check_fields(self, "rejection_sampling")
        _check_choice("rejection_sampling.level", self.level, REJECTION_LEVELS)
        _check_choice("rejection_sampling.action", self.action, REJECTION_ACTIONS)
        _check_choice("rejection_sampling.metric", self.metric, REJECTION_METRICS)
        _check_choice("rejection_sampling.agg", self.agg, REJECTION_AGGS)
        _check_number("rejection_sampling.upper", self.upper)
        _check_number("rejection_sampling.lower", self.lower, optional=True)
        if self.lower is not None and self.lower > self.upper:
            _fail("rejection_sampling.lower", self.lower, f"<= upper ({self.upper})")
        if self.metric == "ratio":
            if self.upper <= 1.0:
                _fail("rejection_sampling.upper", self.upper, "> 1.0 for metric 'ratio'")
            if self.lower is not None and self.lower <= 0.0 and self.action == "mask":
                _fail("rejection_sampling.lower", self.lower, "> 0 for metric 'ratio'")
        elif self.metric != "kl_k1" and self.upper <= 0.0:
            # k2, k3 and binary KL are non-negative: a bound <= 0 rejects everything.
            _fail("rejection_sampling.upper", self.upper, f"> 0 for metric {self.metric!r}")
        if self.action == "clamp":
            if self.metric != "ratio":
                _fail("rejection_sampling.action", self.action, "'mask' for metric " + repr(self.metric)
                      + " (clamp truncates a ratio)")
            if self.lower is None:
                self.lower = 0.0
            elif self.lower < 0.0:
                _fail("rejection_sampling.lower", self.lower, ">= 0 for action 'clamp'")
        if self.level == "token" and self.agg != "mean":
            warnings.warn(f"rejection_sampling.agg={self.agg!r} is ignored at level 'token'", UserWarning,
                          stacklevel=3)


LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimizerConfig:
    """AdamW with warmup and a schedule over RL iterations; one per trained model."""

    lr: float = 1e-5
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.999
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    warmup_steps: int = 0
    """RL iterations of linear warmup from 0 to lr."""
    lr_schedule: str = "constant"
    """After warmup: 'constant', or 'linear' / 'cosine' decay to min_lr_ratio * lr at trainer.max_steps."""
    min_lr_ratio: float = 0.0
    """Final learning rate of a decaying schedule, as a fraction of lr."""
    gradient_clipping: float | None = 1.0
    """Max global gradient norm per optimizer step, or None for no clipping."""

    def __post_init__(self):
        check_fields(self, "optimizer")
        _check_number("optimizer.lr", self.lr, low=0.0, low_open=True)
        _check_number("optimizer.weight_decay", self.weight_decay, low=0.0)
        _check_number("optimizer.beta1", self.beta1, low=0.0, high=1.0)
        _check_number("optimizer.beta2", self.beta2, low=0.0, high=1.0)
        _check_number("optimizer.eps", self.eps, low=0.0, low_open=True)
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            _fail("optimizer.warmup_steps", self.warmup_steps, "an integer >= 0")
        _check_choice("optimizer.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_number("optimizer.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        _check_number("optimizer.gradient_clipping", self.gradient_clipping, low=0.0, low_open=True, optional=True)


@dataclass
class PPOActorConfig:
    """Actor (policy) settings: rewards, advantages, the policy loss and its optimisation."""

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer of the policy."""
    mb_max_tokens: int = 16384
    """Token budget (rows x padded length) of one micro-batch forward/backward; bounds activation memory."""
    ppo_n_minibatches: int = 4
    """Optimizer steps per training step: the batch is split into this many minibatches, one pass."""
    eps_clip: float = 0.2
    """Lower clip epsilon of the ratio; also the upper one when eps_clip_higher is None."""
    eps_clip_higher: float | None = None
    """Upper clip epsilon (DAPO clip-higher), or None to use eps_clip."""
    c_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens by c|A|, or None."""
    reward_norm: NormConfig | None = None
    """Normalisation of the scalar outcome rewards [B] (group z-score for GRPO), or None."""
    reward_scaling: float = 1.0
    """Reward multiplier, applied after reward_bias."""
    reward_bias: float = 0.0
    """Added to the raw reward before scaling."""
    reward_clip: float = 20.0
    """Symmetric clip of the shaped reward, after scaling."""
    overlong_reward_penalty: bool = False
    """DAPO soft overlong penalty on the raw reward; needs overlong_tokens and overlong_penalty_factor."""
    overlong_tokens: int | None = None
    """Length of the penalty buffer L_ov before max_new_tokens."""
    overlong_penalty_factor: float | None = None
    """Penalty reached at max_new_tokens (the factor f)."""
    mask_no_eos_with_zero: bool = False
    """Zero the outcome reward of truncated rows (no stop token within the generation budget)."""
    discount: float = 1.0
    """GAE discount gamma."""
    gae_lambda: float | str = 1.0
    """GAE lambda: a number in [0, 1] or a dotted path to fn(GaeLambdaContext, **gae_lambda_kwargs) -> [B]."""
    gae_lambda_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of a dynamic gae_lambda function; ignored for a number."""
    gae_timestep_unit: str = "token"
    """GAE time step: 'token', or 'turn' (one step per assistant turn; needs turn_ids)."""
    adv_norm: NormConfig | None = None
    """Normalisation of the token advantages [B, T] over generated tokens, or None."""
    kl_ctl: float = 0.1
    """KL penalty coefficient beta in the reward; > 0 builds a frozen reference model."""
    kl_estimator: str = "k1"
    """KL estimator of the reward penalty: 'k1', 'k2' or 'k3'."""
    use_sapo_loss: bool = False
    """SAPO soft-gated loss instead of the PPO clip (same as policy_loss='sapo')."""
    sapo_tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""
    recompute_logprob: bool = False
    """Recompute old log-probs with the trainer instead of reusing the engine's behaviour log-probs."""
    use_decoupled_loss: bool = False
    """Decoupled PPO: ratio against the recomputed proximal policy, times the behaviour weight pi_prox/pi_behave."""
    rejection_sampling: RejectionSamplingConfig | None = None
    """Bounds on the behaviour weight (IcePop, KPop); used with use_decoupled_loss."""
    importance_sampling_level: str = "token"
    """'token' ratio, or 'sequence' (GSPO: geometric mean ratio and mean advantage per sequence)."""
    max_new_tokens: int = 1024
    """L_max of the overlong penalty and of the 'seq-mean-token-sum-norm' constant."""
    temperature: float = 1.0
    """Logit temperature of the trainer's log-probs; must equal the sampling temperature, which it follows
    on the command line unless both are set."""
    policy_loss: str = "ppo"
    """Registered per-token surrogate: 'ppo' (clip) or 'sapo'; new ones via register_policy_loss."""
    adv_estimator: str = "gae"
    """Registered advantage estimator; new ones via register_advantage_estimator."""
    loss_agg_mode: str = "token-mean"
    """'token-mean' (global token mean, AReaL), 'seq-mean-token-mean', 'seq-mean-token-sum', or
    'seq-mean-token-sum-norm' (Dr.GRPO: token sum over sequences x max_new_tokens)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient; 0 logs entropy only (AReaL)."""
    max_skipped_steps: int = 3
    """An optimizer step (actor or critic) whose loss or gradient norm is not finite is skipped: no
    update, counted in actor/skipped_steps or critic/skipped_steps. The run stops with an error once
    this many consecutive RL iterations each had a skipped step (1: stop at the first one)."""

    def __post_init__(self):
        from lit_ppo.algos.gae import ADVANTAGE_ESTIMATORS
        from lit_ppo.algos.lambda_fn import GaeLambdaContext, resolve_gae_lambda
        from lit_ppo.algos.losses import POLICY_LOSSES

        self.optimizer = _as_config(OptimizerConfig, "optimizer", self.optimizer)
        _check_positive_int("mb_max_tokens", self.mb_max_tokens)
        self.reward_norm = _as_config(NormConfig, "reward_norm", self.reward_norm)
        self.adv_norm = _as_config(NormConfig, "adv_norm", self.adv_norm)
        self.rejection_sampling = _as_config(RejectionSamplingConfig, "rejection_sampling",
                                             self.rejection_sampling)
        check_fields(self)
        _check_positive_int("ppo_n_minibatches", self.ppo_n_minibatches)
        _check_number("eps_clip", self.eps_clip, low=0.0)
        _check_number("eps_clip_higher", self.eps_clip_higher, low=0.0, optional=True)
        _check_number("c_clip", self.c_clip, low=1.0, low_open=True, optional=True)
        _check_number("reward_scaling", self.reward_scaling)
        _check_number("reward_bias", self.reward_bias)
        _check_number("reward_clip", self.reward_clip, low=0.0, low_open=True)
        _check_number("discount", self.discount, low=0.0, high=1.0)
        _check_number("kl_ctl", self.kl_ctl, low=0.0)
        _check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _check_choice("gae_timestep_unit", self.gae_timestep_unit, GAE_UNITS)
        _check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        _check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _check_positive_int("max_new_tokens", self.max_new_tokens)
        _check_number("temperature", self.temperature, low=0.0, low_open=True)
        _check_number("entropy_coef", self.entropy_coef, low=0.0)
        _check_positive_int("max_skipped_steps", self.max_skipped_steps)
        if self.overlong_reward_penalty:
            if self.overlong_tokens is None or self.overlong_penalty_factor is None:
                _fail("overlong_reward_penalty", True, "used with overlong_tokens and overlong_penalty_factor set")
            _check_positive_int("overlong_tokens", self.overlong_tokens)
            if self.overlong_tokens > self.max_new_tokens:
                _fail("overlong_tokens", self.overlong_tokens, f"<= max_new_tokens ({self.max_new_tokens})")
            _check_number("overlong_penalty_factor", self.overlong_penalty_factor, low=0.0)

        if self.use_sapo_loss and self.policy_loss not in ("ppo", "sapo"):
            _fail("policy_loss", self.policy_loss, "'sapo' (or unset) when use_sapo_loss is true")
        if self.use_sapo_loss:
            self.policy_loss = "sapo"
        self.use_sapo_loss = self.policy_loss == "sapo"
        if self.policy_loss not in POLICY_LOSSES:
            _fail("policy_loss", self.policy_loss, "one of " + ", ".join(map(repr, POLICY_LOSSES.names())))
        if self.adv_estimator not in ADVANTAGE_ESTIMATORS:
            _fail("adv_estimator", self.adv_estimator, "one of " + ", ".join(map(repr, ADVANTAGE_ESTIMATORS.names())))
        if self.use_sapo_loss:
            _check_number("sapo_tau_pos", self.sapo_tau_pos, low=0.0, low_open=True)
            _check_number("sapo_tau_neg", self.sapo_tau_neg, low=0.0, low_open=True)
            if self.use_decoupled_loss:
                _fail("use_decoupled_loss", True, "false with SAPO (use_sapo_loss / policy_loss='sapo')")

        if isinstance(self.gae_lambda, bool) or not isinstance(self.gae_lambda, (int, float, str)):
            _fail("gae_lambda", self.gae_lambda, "a number in [0, 1] or a dotted path to a lambda function")
        if isinstance(self.gae_lambda, str):
            if not isinstance(self.gae_lambda_kwargs, dict):
                _fail("gae_lambda_kwargs", self.gae_lambda_kwargs, "a mapping of keyword arguments")
            # Import the function and run it on an empty batch: bad paths and bad kwargs fail here.
            resolve_gae_lambda(self.gae_lambda, dict(self.gae_lambda_kwargs))(GaeLambdaContext.empty())
        else:
            _check_number("gae_lambda", self.gae_lambda, low=0.0, high=1.0)
            self.gae_lambda = float(self.gae_lambda)

        if self.rejection_sampling is not None and not self.use_decoupled_loss:
            warnings.warn("actor.rejection_sampling is ignored without actor.use_decoupled_loss=true",
                          UserWarning, stacklevel=3)

    @property
    def eps_clip_high(self) -> float:
        """Upper clip epsilon in effect."""
        return self.eps_clip if self.eps_clip_higher is None else self.eps_clip_higher


@dataclass
class PPOCriticConfig:
    """Critic (value model) settings."""

    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer of the critic."""
    mb_max_tokens: int = 16384
    """Token budget (rows x padded length) of one critic micro-batch."""
    ppo_n_minibatches: int = 4
    """Optimizer steps per training step for the critic."""
    eps_clip: float = 0.5
    """Absolute clip of the value change per update (value clipping)."""

    def __post_init__(self):
        self.optimizer = _as_config(OptimizerConfig, "critic.optimizer", self.optimizer)
        check_fields(self, "critic")
        _check_positive_int("critic.mb_max_tokens", self.mb_max_tokens)
        _check_positive_int("critic.ppo_n_minibatches", self.ppo_n_minibatches)
        _check_number("critic.eps_clip", self.eps_clip, low=0.0, low_open=True)


@dataclass
class GenerationConfig:
    """How completions are sampled (the sampling distribution the trainer recomputes log-probs under)."""

    n_samples: int = 8
    """Completions per prompt: the group size G."""
    max_new_tokens: int = 64
    """Generation budget per completion (per turn for multi-turn workflows)."""
    temperature: float = 1.0
    """Sampling temperature; the trainer's actor.temperature must equal it (and follows it unless set)."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 for all."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 for all."""
    restrict_to_task_tokens: bool = False
    """Sample only the tokens the task allows (e.g. digits + end for arithmetic); the trainer applies
    the same restriction to its log-probs."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens besides the tokenizer's EOS."""

    def __post_init__(self):
        check_fields(self, "gconfig")
        _check_positive_int("gconfig.n_samples", self.n_samples)
        _check_positive_int("gconfig.max_new_tokens", self.max_new_tokens)
        _check_number("gconfig.temperature", self.temperature, low=0.0, low_open=True)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            _fail("gconfig.top_k", self.top_k, "an integer >= 0 (0 disables)")
        _check_number("gconfig.top_p", self.top_p, low=0.0, low_open=True, high=1.0)


@dataclass
class EvalConfig:
    """How the task's test split is scored (``eval/*`` metrics, ``validate`` and ``test``)."""

    k: int = 4
    """Samples per test problem, at the training sampling distribution, for ``eval/pass_at_<k>`` and
    ``eval/mean_at_<k>``; 0 scores the greedy completion only."""
    max_problems: int | None = 256
    """Score the first this many test problems (the split's fixed order, so every evaluation of a
    run sees the same ones); 0 disables evaluation; null scores the whole split."""
    success_threshold: float = 1.0
    """A completion counts as correct when its reward is at least this."""
    batch_size: int = 64
    """Test problems per generate call (per rank)."""

    def __post_init__(self):
        check_fields(self, "eval")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 0:
            _fail("eval.k", self.k, "an integer >= 0 (0: greedy only)")
        if self.max_problems is not None and (not isinstance(self.max_problems, int)
                                              or isinstance(self.max_problems, bool) or self.max_problems < 0):
            _fail("eval.max_problems", self.max_problems, "an integer >= 0 (0 disables evaluation) or null")
        _check_number("eval.success_threshold", self.success_threshold)
        _check_positive_int("eval.batch_size", self.batch_size)

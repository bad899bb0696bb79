"""Algorithm configuration: the one schema for presets, Hydra and LightningCLI.

Field names, types and defaults follow AReaL (docs/algorithms.md#differences-from-areal); every field is validated in
``__post_init__``, against its declared type (``check_fields``, shared by every config section) and then
its range, and an error names the field, the bad value and what is allowed. The settings one policy loss
needs are checked by the rule registered with the loss (``lit_ppo.algos.checks.check_names``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from lit_ppo.config.checks import as_config, check_choice, check_fields, check_number, check_positive_int, fail

NORM_LEVELS = ("batch", "group", None)
REJECTION_LEVELS = ("token", "sequence")
REJECTION_ACTIONS = ("mask", "clamp")
REJECTION_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")
REJECTION_AGGS = ("mean", "sum", "max")
KL_ESTIMATORS = ("k1", "k2", "k3")
GAE_UNITS = ("token", "turn")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
TRUST_REGION_DIVERGENCES = ("binary_tv", "binary_kl")
PROX_LOGP_METHODS = ("recompute", "loglinear", "linear")


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
        check_choice("mean_level", self.mean_level, NORM_LEVELS)
        check_choice("std_level", self.std_level, NORM_LEVELS)
        check_number("eps", self.eps, low=0.0)
        check_positive_int("group_size", self.group_size)


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
        check_choice("rejection_sampling.level", self.level, REJECTION_LEVELS)
        check_choice("rejection_sampling.action", self.action, REJECTION_ACTIONS)
        check_choice("rejection_sampling.metric", self.metric, REJECTION_METRICS)
        check_choice("rejection_sampling.agg", self.agg, REJECTION_AGGS)
        check_number("rejection_sampling.upper", self.upper)
        check_number("rejection_sampling.lower", self.lower, optional=True)
        if self.lower is not None and self.lower > self.upper:
            fail("rejection_sampling.lower", self.lower, f"<= upper ({self.upper})")
        if self.metric == "ratio":
            if self.upper <= 1.0:
                fail("rejection_sampling.upper", self.upper, "> 1.0 for metric 'ratio'")
            if self.lower is not None and self.lower <= 0.0 and self.action == "mask":
                fail("rejection_sampling.lower", self.lower, "> 0 for metric 'ratio'")
        elif self.metric != "kl_k1" and self.upper <= 0.0:
            # k2, k3 and binary KL are non-negative: a bound <= 0 rejects everything.
            fail("rejection_sampling.upper", self.upper, f"> 0 for metric {self.metric!r}")
        if self.action == "clamp":
            if self.metric != "ratio":
                fail("rejection_sampling.action", self.action, "'mask' for metric " + repr(self.metric)
                      + " (clamp truncates a ratio)")
            if self.lower is None:
                self.lower = 0.0
            elif self.lower < 0.0:
                fail("rejection_sampling.lower", self.lower, ">= 0 for action 'clamp'")
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
        check_number("optimizer.lr", self.lr, low=0.0, low_open=True)
        check_number("optimizer.weight_decay", self.weight_decay, low=0.0)
        check_number("optimizer.beta1", self.beta1, low=0.0, high=1.0)
        check_number("optimizer.beta2", self.beta2, low=0.0, high=1.0)
        check_number("optimizer.eps", self.eps, low=0.0, low_open=True)
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            fail("optimizer.warmup_steps", self.warmup_steps, "an integer >= 0")
        check_choice("optimizer.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_number("optimizer.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_number("optimizer.gradient_clipping", self.gradient_clipping, low=0.0, low_open=True, optional=True)


@dataclass
class TrustRegionMaskConfig:
    """DPPO's trust-region mask: a token's loss is dropped when its probability under the policy moved past a
    divergence bound from pi_old, in the direction its advantage pushes (docs/algorithms.md#trust-region-mask)."""

    divergence: str = "binary_tv"
    """'binary_tv': |pi_theta - pi_old| of the sampled token; 'binary_kl': KL(Bern(pi_old) || Bern(pi_theta)),
    'this token' against 'any other'."""
    low: float = 0.15
    """Bound of a token with A < 0 whose probability fell."""
    high: float = 0.15
    """Bound of a token with A > 0 whose probability rose."""

    def __post_init__(self):
        check_fields(self, "trust_region_mask")
        check_choice("trust_region_mask.divergence", self.divergence, TRUST_REGION_DIVERGENCES)
        check_number("trust_region_mask.low", self.low, low=0.0, low_open=True)
        check_number("trust_region_mask.high", self.high, low=0.0, low_open=True)


@dataclass
class ClipCovConfig:
    """Clip-Cov: a random few of the tokens of highest covariance between advantage and log-prob lose their
    gradient (docs/algorithms.md#clip-cov-and-kl-cov)."""

    ratio: float = 2e-4
    """Share of the micro-batch's generated tokens that lose it (at least one)."""
    low: float = 1.0
    """Tokens whose covariance lies strictly between low and high are the candidates."""
    high: float = 5.0
    """Upper bound of the candidates' covariance."""

    def __post_init__(self):
        check_fields(self, "clip_cov")
        check_number("clip_cov.ratio", self.ratio, low=0.0, low_open=True, high=1.0)
        check_number("clip_cov.low", self.low)
        check_number("clip_cov.high", self.high)
        if self.low >= self.high:
            fail("clip_cov.low", self.low, f"< high ({self.high})")


@dataclass
class KLCovConfig:
    """KL-Cov: the tokens of highest covariance between advantage and log-prob get a penalty on how far their
    log-prob moved (docs/algorithms.md#clip-cov-and-kl-cov)."""

    ratio: float = 2e-3
    """Share of the micro-batch's generated tokens penalised (at least one)."""
    coef: float = 1.0
    """The penalty coef * |log pi_theta - log pi_old| on each of them."""

    def __post_init__(self):
        check_fields(self, "kl_cov")
        check_number("kl_cov.ratio", self.ratio, low=0.0, low_open=True, high=1.0)
        check_number("kl_cov.coef", self.coef, low=0.0, low_open=True)


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
    multi_objective_aggregation: str = "sum_then_normalize"
    """How the values of a task's several reward functions become one normalised reward: 'sum_then_normalize'
    (their weighted sum, shaped and normalised as one reward) or 'normalize_then_sum' (GDPO, arXiv:2601.05242:
    each function's values shaped and normalised by reward_norm on their own, None read as 0, their weighted sum
    then normalised over the batch's rows). A task with one reward is normalised as one either way."""
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
    gpg_alpha: bool = False
    """Scale the advantages by GPG's alpha = B / (B - M), M the rows (of B, all ranks) in prompt groups whose
    rewards are all equal, so that the groups without signal do not dilute the gradient (GPG, arXiv:2504.02546)."""
    kl_ctl: float = 0.1
    """KL penalty coefficient beta in the reward; > 0 builds a frozen reference model."""
    kl_estimator: str = "k1"
    """KL estimator of the reward penalty: 'k1', 'k2' or 'k3'."""
    kl_loss_coef: float = 0.0
    """beta of a KL term in the loss, beta * K(log pi_theta - log pi_ref) per token with its gradient (GRPO's
    own form; TRL's beta, verl's kl_loss_coef); > 0 builds a frozen reference model (or uses model.teacher)."""
    kl_loss_estimator: str = "k3"
    """KL estimator of the loss term: 'k1', 'k2' or 'k3' (TRL's and verl's low_var_kl)."""
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
    prox_logp_method: str = "recompute"
    """With the decoupled loss, where pi_prox comes from: 'recompute' (a forward pass before the update),
    or 'loglinear' / 'linear' (AReaL's approximations from the behaviour log-probs, the update's own
    forward pass and each token's version, which skip that pass)."""
    rejection_sampling: RejectionSamplingConfig | None = None
    """Bounds on the behaviour weight (IcePop, KPop); used with use_decoupled_loss."""
    m2_threshold: float | None = None
    """M2PO (AReaL's key): with the decoupled loss, drop the tokens of largest (log pi_behave - log pi_prox)^2
    until the mean of the rest is below this (0.04 in the paper); None: no M2PO mask."""
    trust_region_mask: TrustRegionMaskConfig | None = None
    """DPPO's binary-TV / binary-KL trust-region mask on the policy loss, or None."""
    clip_cov: ClipCovConfig | None = None
    """Clip-Cov's token selection on top of the policy loss (arXiv:2505.22617), or None."""
    kl_cov: KLCovConfig | None = None
    """KL-Cov's penalty on top of the policy loss (arXiv:2505.22617), or None."""
    top_entropy_quantile: float = 1.0
    """Only the tokens whose entropy is in this top fraction of the micro-batch's generated tokens keep their
    loss (0.2 in "Beyond the 80/20 Rule", arXiv:2506.01939; TRL's key); the others still count in the
    normaliser. 1.0 keeps every token."""
    importance_sampling_level: str = "token"
    """'token' ratio, or 'sequence' (GSPO: geometric mean ratio and mean advantage per sequence)."""
    max_new_tokens: int = 1024
    """L_max of the overlong penalty and of the 'seq-mean-token-sum-norm' constant."""
    temperature: float = 1.0
    """Logit temperature of the trainer's log-probs; must equal the sampling temperature, which it follows
    on the command line unless both are set."""
    policy_loss: str = "ppo"
    """Registered per-token surrogate: 'ppo' (clip), 'sapo', 'cispo', 'gmpo', 'gpg' or 'unclipped'; new ones
    via register_policy_loss."""
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
        self.optimizer = as_config(OptimizerConfig, "optimizer", self.optimizer)
        check_positive_int("mb_max_tokens", self.mb_max_tokens)
        self.reward_norm = as_config(NormConfig, "reward_norm", self.reward_norm)
        self.adv_norm = as_config(NormConfig, "adv_norm", self.adv_norm)
        self.rejection_sampling = as_config(RejectionSamplingConfig, "rejection_sampling",
                                             self.rejection_sampling)
        self.trust_region_mask = as_config(TrustRegionMaskConfig, "trust_region_mask", self.trust_region_mask)
        self.clip_cov = as_config(ClipCovConfig, "clip_cov", self.clip_cov)
        self.kl_cov = as_config(KLCovConfig, "kl_cov", self.kl_cov)
        check_fields(self)
        check_positive_int("ppo_n_minibatches", self.ppo_n_minibatches)
        check_number("eps_clip", self.eps_clip, low=0.0)
        check_number("eps_clip_higher", self.eps_clip_higher, low=0.0, optional=True)
        check_number("c_clip", self.c_clip, low=1.0, low_open=True, optional=True)
        check_number("reward_scaling", self.reward_scaling)
        check_number("reward_bias", self.reward_bias)
        check_number("reward_clip", self.reward_clip, low=0.0, low_open=True)
        check_number("discount", self.discount, low=0.0, high=1.0)
        check_number("kl_ctl", self.kl_ctl, low=0.0)
        check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        check_number("kl_loss_coef", self.kl_loss_coef, low=0.0)
        check_choice("kl_loss_estimator", self.kl_loss_estimator, KL_ESTIMATORS)
        check_choice("gae_timestep_unit", self.gae_timestep_unit, GAE_UNITS)
        check_choice("multi_objective_aggregation", self.multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS)
        check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        check_positive_int("max_new_tokens", self.max_new_tokens)
        check_number("temperature", self.temperature, low=0.0, low_open=True)
        check_number("entropy_coef", self.entropy_coef, low=0.0)
        check_number("top_entropy_quantile", self.top_entropy_quantile, low=0.0, low_open=True, high=1.0)
        check_positive_int("max_skipped_steps", self.max_skipped_steps)
        if self.overlong_reward_penalty:
            if self.overlong_tokens is None or self.overlong_penalty_factor is None:
                fail("overlong_reward_penalty", True, "used with overlong_tokens and overlong_penalty_factor set")
            check_positive_int("overlong_tokens", self.overlong_tokens)
            if self.overlong_tokens > self.max_new_tokens:
                fail("overlong_tokens", self.overlong_tokens, f"<= max_new_tokens ({self.max_new_tokens})")
            check_number("overlong_penalty_factor", self.overlong_penalty_factor, low=0.0)
            if self.multi_objective_aggregation == "normalize_then_sum":
                raise ValueError("overlong_reward_penalty=true cannot be used with multi_objective_aggregation="
                                 "normalize_then_sum: the penalty would be one more reward; give it as a reward "
                                 "function of its own")

        if self.use_sapo_loss and self.policy_loss not in ("ppo", "sapo"):
            fail("policy_loss", self.policy_loss, "'sapo' (or unset) when use_sapo_loss is true")
        if self.use_sapo_loss:
            self.policy_loss = "sapo"
        self.use_sapo_loss = self.policy_loss == "sapo"
        check_choice("prox_logp_method", self.prox_logp_method, PROX_LOGP_METHODS)
        if self.prox_logp_method != "recompute" and not self.use_decoupled_loss:
            fail("prox_logp_method", self.prox_logp_method, "'recompute' without use_decoupled_loss=true (there is "
                                                            "no proximal policy to approximate)")
        if self.m2_threshold is not None:
            check_number("m2_threshold", self.m2_threshold, low=0.0, low_open=True)
            if not self.use_decoupled_loss:
                fail("m2_threshold", self.m2_threshold, "null without use_decoupled_loss=true (its mask compares "
                                                        "the behaviour and proximal log-probs)")

        if isinstance(self.gae_lambda, bool) or not isinstance(self.gae_lambda, (int, float, str)):
            fail("gae_lambda", self.gae_lambda, "a number in [0, 1] or a dotted path to a lambda function")
        if isinstance(self.gae_lambda, str):
            if not isinstance(self.gae_lambda_kwargs, dict):
                fail("gae_lambda_kwargs", self.gae_lambda_kwargs, "a mapping of keyword arguments")
        else:
            check_number("gae_lambda", self.gae_lambda, low=0.0, high=1.0)
            self.gae_lambda = float(self.gae_lambda)

        if self.rejection_sampling is not None and not self.use_decoupled_loss:
            warnings.warn("actor.rejection_sampling is ignored without actor.use_decoupled_loss=true",
                          UserWarning, stacklevel=3)

    @property
    def approximates_prox(self) -> bool:
        """pi_prox comes from an approximation (prox_logp_method), not a recomputing forward pass."""
        return self.prox_logp_method != "recompute"

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
        self.optimizer = as_config(OptimizerConfig, "critic.optimizer", self.optimizer)
        check_fields(self, "critic")
        check_positive_int("critic.mb_max_tokens", self.mb_max_tokens)
        check_positive_int("critic.ppo_n_minibatches", self.ppo_n_minibatches)
        check_number("critic.eps_clip", self.eps_clip, low=0.0, low_open=True)


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
        check_positive_int("gconfig.n_samples", self.n_samples)
        check_positive_int("gconfig.max_new_tokens", self.max_new_tokens)
        check_number("gconfig.temperature", self.temperature, low=0.0, low_open=True)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            fail("gconfig.top_k", self.top_k, "an integer >= 0 (0 disables)")
        check_number("gconfig.top_p", self.top_p, low=0.0, low_open=True, high=1.0)


@dataclass
class EvalConfig:
    """How the task's test split is scored (``eval/*`` metrics, ``validate`` and ``test``).

    Scored before the first iteration (``before_training``), every ``trainer.val_check_interval`` iterations,
    at the end of ``fit``, and by ``validate`` / ``test`` (``lit_ppo.rollout.evaluation``)."""

    k: int = 4
    """Samples per test problem, at the training sampling distribution, for ``eval/pass_at_<k>`` and
    ``eval/mean_at_<k>``; 0 scores the greedy completion only."""
    max_problems: int | None = 256
    """Score the first this many test problems (the split's fixed order, so every evaluation of a
    run sees the same ones); 0 disables evaluation; null scores the whole split."""
    success_threshold: float = 1.0
    """A completion counts as correct when its reward is at least this (with ``data=dataset``, the value of
    the one reward function ``data.task_kwargs.accuracy_reward`` names, not the weighted sum)."""
    batch_size: int = 64
    """Test problems per generate call (per rank)."""
    before_training: bool = True
    """Score the untrained policy once before the first iteration, logged at iteration 0, so that the eval curves
    start from it (verl's ``trainer.val_before_train``, on by default there too). A fit resumed from a checkpoint
    does not: its policy is trained already, and the run it continues has scored its start. Nothing without a test
    split or with evaluation off (``max_problems=0``, ``trainer.limit_val_batches=0``)."""

    def __post_init__(self):
        check_fields(self, "eval")
        if not isinstance(self.before_training, bool):
            fail("eval.before_training", self.before_training, "true or false")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 0:
            fail("eval.k", self.k, "an integer >= 0 (0: greedy only)")
        if self.max_problems is not None and (not isinstance(self.max_problems, int)
                                              or isinstance(self.max_problems, bool) or self.max_problems < 0):
            fail("eval.max_problems", self.max_problems, "an integer >= 0 (0 disables evaluation) or null")
        check_number("eval.success_threshold", self.success_threshold)
        check_positive_int("eval.batch_size", self.batch_size)

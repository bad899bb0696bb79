"""The two names of a config key: LightningCLI's dotted path (what ``--print_config`` shows) and the key
typed on the command line (``model.actor.eps_clip`` is ``actor.eps_clip``). One table, ``SECTIONS``,
holds the correspondence; both directions are derived from it: ``typed_key`` (LightningCLI's name to the
command line's, e.g. for MLflow params) and ``lightning_path`` (the command line's to LightningCLI's), which
``set_key`` uses to set a key of a LightningCLI tree."""

from __future__ import annotations

from typing import Any

from lit_ppo.errors import ConfigError

ROLLOUT_KEYS = ("engine", "engine_kwargs", "max_logp_gap", "max_head_offpolicyness", "num_threads", "devices")
"""The rollout group's keys: RolloutDataModule arguments under their own names (rollout.engine -> data.engine)."""
SECTIONS = {"actor": "model.actor", "algo": "model.algo", "critic": "model.critic", "data": "data",
            "eval": "data.eval", "gconfig": "data.gconfig", "logger": "trainer.logger", "model": "model.model",
            "seed": "seed_everything", "trainer": "trainer", "rollout": "data"}
"""Section typed on the command line (a root of the Hydra config) -> where LightningCLI's tree holds it. In
the order that error messages list them: by name, rollout last, since its keys (``ROLLOUT_KEYS``) are
data's, set over those of the data section."""
LIGHTNING_SECTIONS = tuple(dict.fromkeys(path.split(".")[0] for path in SECTIONS.values()))
"""The roots of LightningCLI's tree that a config sets: model, data, trainer, seed_everything."""
LIGHTNING_NAMES = (*((path, typed) for typed, path in SECTIONS.items() if typed not in (path, "rollout")),
                   *((f"{SECTIONS['rollout']}.{key}", f"rollout.{key}") for key in ROLLOUT_KEYS))
"""Section of LightningCLI's tree -> the key typed on the command line, where the two names differ."""


FOREIGN_KEYS: dict[str, tuple[str, str | None, str]] = {
    # TRL's GRPOConfig / TrainingArguments (bare names)
    "learning_rate": ("TRL", "actor.optimizer.lr", ""),
    "num_generations": ("TRL", "gconfig.n_samples", ""),
    "max_completion_length": ("TRL", "gconfig.max_new_tokens", ""),
    "per_device_train_batch_size": ("TRL", "data.batch_size", " (prompts per iteration, each sampled "
                                    "gconfig.n_samples times; TRL's counts completions per device)"),
    "gradient_accumulation_steps": ("TRL", "actor.mb_max_tokens", " (micro-batches by a token budget; the loss "
                                    "is normalised over the whole minibatch, so results do not depend on it)"),
    "steps_per_generation": ("TRL", "actor.ppo_n_minibatches", " (optimizer steps per generated batch)"),
    "beta": ("TRL", "actor.kl_loss_coef", " (TRL's KL term is in the loss, k3; actor.kl_ctl puts it in the reward)"),
    "epsilon": ("TRL", "actor.eps_clip", ""),
    "epsilon_high": ("TRL", "actor.eps_clip_higher", ""),
    "temperature": ("TRL", "gconfig.temperature", ""),
    "top_p": ("TRL", "gconfig.top_p", ""),
    "top_k": ("TRL", "gconfig.top_k", ""),
    "num_train_epochs": ("TRL", "trainer.max_steps", " (lit_ppo counts RL iterations, each data.batch_size "
                         "prompts)"),
    "max_steps": ("TRL", "trainer.max_steps", ""),
    "reward_funcs": ("TRL", "data.task_kwargs.reward_fns", ""),
    "reward_weights": ("TRL", "data.task_kwargs.reward_weights", ""),
    "reward_processing_classes": ("TRL", "data.task_kwargs.reward_model", " (a reward model directory in reward_fns "
                                  "reads text with its own tokenizer and chat template)"),
    "multi_objective_aggregation": ("TRL", "actor.multi_objective_aggregation", " (normalize_then_sum is GDPO, "
                                    "as algo=gdpo sets it)"),
    "loss_type": ("TRL", "actor.loss_agg_mode", " (dapo: token-mean, grpo: seq-mean-token-mean, dr_grpo: "
                  "seq-mean-token-sum-norm)"),
    "scale_rewards": ("TRL", "actor.reward_norm.std_level", " (group, batch, or actor.reward_norm.std_level=null "
                      "for none)"),
    "mask_truncated_completions": ("TRL", "actor.mask_no_eos_with_zero", ""),
    "top_entropy_quantile": ("TRL", "actor.top_entropy_quantile", ""),
    "entropy_coef": ("TRL", "actor.entropy_coef", ""),
    "max_grad_norm": ("TRL", "actor.optimizer.gradient_clipping", ""),
    "warmup_steps": ("TRL", "actor.optimizer.warmup_steps", ""),
    "lr_scheduler_type": ("TRL", "actor.optimizer.lr_schedule", ""),
    "weight_decay": ("TRL", "actor.optimizer.weight_decay", ""),
    "adam_beta1": ("TRL", "actor.optimizer.beta1", ""),
    "adam_beta2": ("TRL", "actor.optimizer.beta2", ""),
    "adam_epsilon": ("TRL", "actor.optimizer.eps", ""),
    "gradient_checkpointing": ("TRL", "model.gradient_checkpointing", ""),
    "bf16": ("TRL", "trainer.precision=bf16-mixed", ""),
    "use_vllm": ("TRL", "rollout=vllm", ""),
    "save_steps": ("TRL", "checkpoint.every_n_iterations", ""),
    "save_total_limit": ("TRL", "checkpoint.keep", ""),
    "eval_steps": ("TRL", "trainer.val_check_interval", ""),
    "logging_steps": ("TRL", "trainer.log_every_n_steps", ""),
    "log_completions": ("TRL", "samples.every_n_iterations", " (0 logs none)"),
    "num_completions_to_print": ("TRL", "samples.count", ""),
    "report_to": ("TRL", "logger=mlflow", " (or csv, tensorboard, wandb, none)"),
    "run_name": ("TRL", "logger.init_args.run_name", ""),
    "model_name_or_path": ("TRL", "model=DIR", " (a local model directory or a hub id in the local cache)"),
    "output_dir": ("TRL", "trainer.default_root_dir", " (runs by default; each run writes a directory of its "
                   "own under it, in a folder of its experiment)"),
    # verl's names for the most common settings
    "actor_rollout_ref.model.path": ("verl", "model=DIR", " (a local model directory or a hub id in the local "
                                     "cache)"),
    "actor_rollout_ref.actor.optim.lr": ("verl", "actor.optimizer.lr", ""),
    "actor_rollout_ref.rollout.n": ("verl", "gconfig.n_samples", ""),
    "data.max_prompt_length": ("verl", None, " (lit_ppo samples every prompt whole, neither cut nor dropped for its "
                               "length; gconfig.max_new_tokens bounds the completion)"),
    "data.max_response_length": ("verl", "gconfig.max_new_tokens", ""),
    "data.train_batch_size": ("verl", "data.batch_size", ""),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("verl", "actor.ppo_n_minibatches", " (a count of "
                                                    "minibatches, not a size: data.train_batch_size / "
                                                    "ppo_mini_batch_size)"),
    "actor_rollout_ref.actor.clip_ratio": ("verl", "actor.eps_clip", ""),
    "actor_rollout_ref.actor.clip_ratio_high": ("verl", "actor.eps_clip_higher", ""),
    "actor_rollout_ref.actor.use_kl_loss": ("verl", "actor.kl_loss_coef", " (> 0 turns the KL term of the loss on; "
                                            "it has no switch of its own)"),
    "actor_rollout_ref.actor.kl_loss_coef": ("verl", "actor.kl_loss_coef", " (the KL term in the loss; verl's "
                                             "kl_loss_type low_var_kl is actor.kl_loss_estimator=k3, the default, "
                                             "without verl's clamp at 10)"),
    "algorithm.use_kl_in_reward": ("verl", "actor.kl_ctl", " (> 0 puts the KL penalty in the reward; it has no "
                                   "switch of its own)"),
    "algorithm.kl_ctrl.kl_coef": ("verl", "actor.kl_ctl", " (the KL penalty in the reward; verl's kl_penalty kl is "
                                  "actor.kl_estimator=k1, the default, clamped here to [-10, 10])"),
    "algorithm.adv_estimator": ("verl", "algo=grpo", " (or ppo, rloo, ...: a preset)"),
    "trainer.total_training_steps": ("verl", "trainer.max_steps", ""),
    "trainer.val_before_train": ("verl", "eval.before_training", " (on by default in both: the untrained policy "
                                 "scored before the first iteration)"),
    "trainer.total_epochs": ("verl", "trainer.max_steps", " (lit_ppo counts RL iterations, each data.batch_size "
                             "prompts, not passes over the data)"),
}
"""Another trainer's name of a setting (TRL's bare names, verl's dotted paths) -> (the trainer, lit_ppo's key or
override, or None where lit_ppo has none; what differs, or why there is none). ``foreign_key_hint`` answers a key
that is not lit_ppo's with it."""


UNSAMPLED_SETTINGS = {
    "repetition_penalty": "a repetition penalty reweights each token by the tokens its sequence holds already",
    "min_p": "min-p sampling cuts each token's support relative to its most likely token",
}
"""Sampling settings of other trainers that lit_ppo does not sample with -> what they do to the distribution."""


def foreign_key_answer(key: str) -> str | None:
    """``TRL's learning_rate is actor.optimizer.lr`` for a ``key`` that another trainer names: the whole dotted
    key, a bare name that ends one of verl's dotted keys (``max_prompt_length``), or, for TRL's bare names,
    the key's last part; why lit_ppo does not sample with a sampling setting; None otherwise."""
    name = key if key in FOREIGN_KEYS else _foreign_name_ending(key) or key.rsplit(".", 1)[-1]
    if name in UNSAMPLED_SETTINGS:
        return (f"lit_ppo does not sample with {name} ({UNSAMPLED_SETTINGS[name]}): the trainer's log-probs do "
                f"not follow it, so the importance ratio would be biased; gconfig.temperature, top_k and top_p "
                f"are followed exactly")
    if name not in FOREIGN_KEYS:
        return None
    trainer, setting, differs = FOREIGN_KEYS[name]
    return f"{trainer}'s {name} has no lit_ppo key{differs}" if setting is None else \
        f"{trainer}'s {name} is {setting}{differs}"


def _foreign_name_ending(key: str) -> str | None:
    """The one dotted name of ``FOREIGN_KEYS`` that the bare ``key`` of several words ends
    (``max_prompt_length``: ``data.max_prompt_length``); None for a dotted key, a one-word key (``lr``, ``n``:
    too general to tell whose) or none or several such names."""
    if "." in key or "_" not in key:
        return None
    names = [name for name in FOREIGN_KEYS if name.endswith("." + key)]
    return names[0] if len(names) == 1 else None


def foreign_key_hint(key: str) -> str | None:
    """``: <foreign_key_answer(key)>``, or None."""
    answer = foreign_key_answer(key)
    return None if answer is None else f": {answer}"


def foreign_keys_error(keys: list[str], lit_roots: set[str]) -> str | None:
    """The one line that answers every key of ``keys`` (as typed, one command's) that is another trainer's
    name and not lit_ppo's: a key of ``FOREIGN_KEYS``, or one outside ``lit_roots`` (the sections and preset
    groups of lit_ppo's config) that ``foreign_key_answer`` knows. None when there is none."""
    found = {key: foreign_key_answer(key) for key in dict.fromkeys(keys)
             if key in FOREIGN_KEYS or key.split(".", 1)[0] not in lit_roots}
    answers = {key: answer for key, answer in found.items() if answer is not None}
    if not answers:
        return None
    *first, last = answers
    names = f"{', '.join(first)} and {last} are not keys" if first else f"{last} is not a key"
    return f"{names}: {'; '.join(answers.values())}"


JOB_SECTIONS = ("data.sft", "data.rm")
"""Where the trees of the sft and rm jobs hold their own sections, typed as ``sft.*`` and ``rm.*``."""


def typed_key(key: str) -> str:
    """The command line's name of LightningCLI's dotted ``key``: ``model.actor.eps_clip`` -> ``actor.eps_clip``,
    ``data.engine`` -> ``rollout.engine``, ``trainer.logger.init_args.run_name`` -> ``logger.init_args.run_name``,
    ``data.rm.epochs`` -> ``rm.epochs``."""
    if key.startswith(tuple(f"{section}." for section in JOB_SECTIONS)):
        return key.removeprefix("data.")
    for lightning, typed in LIGHTNING_NAMES:
        if key == lightning or key.startswith(lightning + "."):
            return typed + key[len(lightning):]
    return key


def lightning_path(key: str) -> tuple[str, ...] | None:
    """Where LightningCLI's tree holds the command line's dotted ``key``, part by part: ``actor.eps_clip``
    -> ``("model", "actor", "eps_clip")``, ``rollout.engine`` -> ``("data", "engine")``, ``seed`` ->
    ``("seed_everything",)``; None for a key in no section."""
    root, *rest = key.split(".")
    return (*SECTIONS[root].split("."), *rest) if root in SECTIONS else None


def key_path(key: str) -> tuple[str, ...]:
    """``lightning_path(key)``; ConfigError for a key in no section."""
    path = lightning_path(key)
    if path is None:
        raise ConfigError(f"{key} is not a key" + (foreign_key_hint(key)
                                                   or f": must start with one of {', '.join(SECTIONS)}"))
    return path


def set_key(tree: dict, key: str, value: Any) -> None:
    """Set the command line's ``key`` of the LightningCLI ``tree`` to ``value``, making the mappings on the
    way; ``seed`` sets ``data.seed`` too, as on the command line. ConfigError for a key in no section or
    under a value that is not a mapping."""
    *parents, last = key_path(key)
    node = tree
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a mapping in the config")
        node = child
    node[last] = value
    if key == "seed":
        tree.setdefault("data", {})["seed"] = value

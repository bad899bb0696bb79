"""The names an actor config refers to, resolved where the algorithms live: the config layer checks
values, this layer checks that ``policy_loss`` and ``adv_estimator`` are registered, that the settings the
loss needs hold (the rule registered with it) and that a dynamic ``gae_lambda`` function imports and runs
(the verl direction: configs never import the math)."""

from __future__ import annotations

from lit_ppo.algos.gae import ADVANTAGE_ESTIMATORS
from lit_ppo.algos.lambda_fn import GaeLambdaContext, resolve_gae_lambda
from lit_ppo.algos.surrogates import POLICY_LOSSES
from lit_ppo.config import PPOActorConfig
from lit_ppo.config.checks import fail


def check_names(actor: PPOActorConfig) -> None:
    """ValueError of one line naming the field unless ``actor.policy_loss`` is registered and its rule
    holds, ``actor.adv_estimator`` is registered and a ``gae_lambda`` dotted path imports and runs on an
    empty batch with ``gae_lambda_kwargs``."""
    if actor.policy_loss not in POLICY_LOSSES:
        fail("policy_loss", actor.policy_loss, "one of " + ", ".join(map(repr, POLICY_LOSSES.names())))
    loss_rule = POLICY_LOSSES.rule(actor.policy_loss)
    if loss_rule is not None:
        loss_rule(actor)
    if actor.adv_estimator not in ADVANTAGE_ESTIMATORS:
        fail("adv_estimator", actor.adv_estimator, "one of " + ", ".join(map(repr, ADVANTAGE_ESTIMATORS.names())))
    if isinstance(actor.gae_lambda, str):
        resolve_gae_lambda(actor.gae_lambda, dict(actor.gae_lambda_kwargs))(GaeLambdaContext.empty())

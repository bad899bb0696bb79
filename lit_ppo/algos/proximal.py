"""The proximal policy's log-probs approximated from the behaviour and the trained policy's, without the
forward pass that recomputes them (AReaL's ``prox_logp_method``; docs/algorithms.md#proximal-log-probs).

The proximal policy is the weights before this iteration's update, version V. A token sampled by version
v_t <= V lies between the behaviour policy (v_t) and the policy being trained, taken as the version the
update produces (V + 1); linear in the version, the proximal one is alpha_t of the way:

    alpha_t = (V - v_t) / (V + 1 - v_t)       (0 for on-policy tokens, 1/2 one version stale, ...)
    loglinear: log pi_prox = log pi_behave + alpha_t (log pi_theta - log pi_behave)
    linear:    log pi_prox = log((1 - alpha_t) pi_behave + alpha_t pi_theta)

alpha_t is 0 where the token has no version (v_t < 0). log pi_theta is detached.
"""

from __future__ import annotations

import torch


def prox_alpha(versions: torch.Tensor, version: int) -> torch.Tensor:
    """alpha_t of each token of version ``versions`` (``[B, T]``, -1 for none) when the weights are ``version``."""
    v = versions.float()
    usable = (versions >= 0) & (versions <= version)
    return torch.where(usable, (version - v) / (version + 1 - v).clamp(min=1.0), 0.0)


def approximate_prox_logp(behave_logp: torch.Tensor, logp: torch.Tensor, versions: torch.Tensor, version: int,
                          method: str) -> torch.Tensor:
    """log pi_prox of each token by ``method`` ('loglinear' or 'linear'), from the behaviour log-probs, the
    trained policy's ``logp`` (detached here) and the tokens' ``versions``."""
    alpha = prox_alpha(versions, version)
    behave, theta = behave_logp.detach().float(), logp.detach().float()
    if method == "loglinear":
        return behave + alpha * (theta - behave)
    if method == "linear":
        return torch.logaddexp(torch.log1p(-alpha) + behave, alpha.log() + theta)
    raise ValueError(f"prox_logp_method={method!r} is invalid: must be 'loglinear' or 'linear' (or 'recompute')")

"""The critic: a causal LM body with a scalar value head (``ValueModel``), initialised from the policy."""

from __future__ import annotations

import copy

import torch

from lit_ppo.models.logprobs import _hidden_states, _label_positions


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

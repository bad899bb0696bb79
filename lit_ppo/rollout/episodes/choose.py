"""The workflow that plays a task's problems, chosen by what the task provides: an agent
(``AgentTask``), an environment (``MultiTurnTask``), or neither (a single turn)."""

from __future__ import annotations

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.episode import Workflow
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks.base import Task, is_agent, is_multi_turn


def build_workflow(task: Task, tokenizer, params: SamplingParams, rollout: RolloutConfig, *, max_model_len: int,
                   evaluating: bool = False) -> Workflow:
    """The workflow of ``task``, sampling with ``params`` under the settings ``rollout``.

    Args:
        task: the task whose problems it plays.
        tokenizer: the policy's tokenizer, with a chat template.
        params: the sampling parameters of every request.
        rollout: the rollout's settings.
        max_model_len: the most tokens one sequence of an agent's episode may hold.
        evaluating: the workflow of an evaluation: an agent's keeps one row per episode (its final sample),
            as evaluation scores episodes.
    """
    if is_agent(task):
        # Imported for an agent only: its OpenAI-compatible client loads the openai SDK (most of a second).
        from lit_ppo.rollout.episodes.agent import AgentWorkflow

        return AgentWorkflow(tokenizer, task, params, rollout, max_model_len, evaluating=evaluating)
    if is_multi_turn(task):
        return MultiTurnWorkflow(tokenizer, task, params, rollout)
    return SingleTurnWorkflow(tokenizer, task, params, rollout)

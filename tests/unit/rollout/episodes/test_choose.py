"""Unit tests for ``lit_ppo.rollout.episodes.choose``: the workflow a task gets, with the rollout's settings."""

from __future__ import annotations

from lit_ppo.config import RolloutConfig
from lit_ppo.models import build_tiny_tokenizer
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.agent import AgentWorkflow
from lit_ppo.rollout.episodes.choose import build_workflow
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks import AgentFunctionTask, ArithmeticTask, CalculatorTask

TOK = build_tiny_tokenizer()
PARAMS = SamplingParams(n=2, max_new_tokens=8)
ROLLOUT = RolloutConfig(max_turns=3, turn_discount=0.5, system_prompt="s", on_drift="error", episodes_in_flight=4)


def solve(client, problem):
    return 1.0


def build(task, evaluating: bool = False):
    return build_workflow(task, TOK, PARAMS, ROLLOUT, max_model_len=512, evaluating=evaluating)


def test_a_task_gets_the_workflow_of_what_it_provides_with_the_rollouts_settings():
    arithmetic = ArithmeticTask(num_train=1, num_test=1)
    single = build(arithmetic)
    assert isinstance(single, SingleTurnWorkflow) and single.params is PARAMS and single.system_prompt == "s"
    multi = build(CalculatorTask(num_train=1, num_test=1))
    assert isinstance(multi, MultiTurnWorkflow) and (multi.max_turns, multi.turn_discount) == (3, 0.5)
    agent = build(AgentFunctionTask(solve, arithmetic))
    assert isinstance(agent, AgentWorkflow) and (agent.max_model_len, agent.episodes_in_flight) == (512, 4)
    assert (agent.on_drift, agent.one_row_per_episode) == ("error", False)


def test_an_evaluation_of_an_agent_keeps_each_episodes_final_sample_and_never_stops_on_a_drift():
    agent = build(AgentFunctionTask(solve, ArithmeticTask(num_train=1, num_test=1)), evaluating=True)
    assert (agent.on_drift, agent.one_row_per_episode) == ("last", True)

"""Agents as tasks (lit_ppo.rollout.agent_workflow): sync and async agents through the OpenAI-compatible
client, their samples grouped by problem with the episode's reward, episodes in flight at once, and every
way an episode fails (raises, hangs, returns no reward, never calls), stopping the run or dropping the group."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from lit_ppo.errors import RunStopped
from lit_ppo.rollout.agent_workflow import AgentWorkflow
from lit_ppo.rollout.engine import Completion, SamplingParams
from lit_ppo.tasks.base import Problem
from tests.unit.rollout.test_chat_client import CALC, IM_END, TOOLS_CHATML, chatml_tokenizer

TOK = chatml_tokenizer(TOOLS_CHATML)
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "%s"}}\n</tool_call>'


class AnsweringEngine:
    """Answers a prompt by what it ends with: a question "a+b?" gets a calc call, a tool result gets the result
    back; every reply stops, log-prob -1 per token, the version 5. Fails if two calls overlap."""

    version = 5

    def __init__(self, delay: float = 0.01):
        self.calls = self.prompts = 0
        self.delay = delay
        self.lock = threading.Lock()

    def generate(self, prompts, params):
        assert self.lock.acquire(blocking=False), "two episodes sampled from the engine at once"
        time.sleep(self.delay)  # long enough for an unguarded second call to overlap
        self.lock.release()
        out = []
        for prompt in prompts:
            text = TOK.decode(prompt)
            if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
                reply = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
            else:
                reply = CALL % text.rsplit("<|im_start|>user\n", 1)[1].split("?")[0]
            ids = TOK.encode(reply, add_special_tokens=False) + [TOK.eos_token_id]
            out.append([Completion(ids, [-1.0] * len(ids), True, self.version)] * params.n)
        self.calls += 1
        self.prompts += len(prompts)
        return out


def solve(client, problem):
    """Ask, run the tool it calls, ask again; 1.0 for the right answer."""
    messages = [{"role": "user", "content": f"{problem.prompt}?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    call = first.choices[0].message.tool_calls[0]
    value = str(eval(eval(call.function.arguments)["expression"]))  # the test's own calculator
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": value}]
    final = client.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    return float(final.choices[0].message.content == problem.answer)


class AgentTask:
    name = "agent-test"

    def __init__(self, agent):
        self.agent = agent

    def problems(self, split):
        return []

    def reward(self, problem, completion):
        raise AssertionError("an agent task's reward is its agent's")

    def allowed_completion_tokens(self, tokenizer):
        return None


PROBLEMS = [Problem("3+4", "7"), Problem("2*5", "11")]  # the second answer is wrong on purpose


def workflow(agent, **kwargs) -> AgentWorkflow:
    params = SamplingParams(n=2, max_new_tokens=128, stop_token_ids=[TOK.eos_token_id], seed=1)
    return AgentWorkflow(TOK, AgentTask(agent), params, max_model_len=4096, **kwargs)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_each_episode_is_one_sample_of_two_turns_with_the_agents_reward(asynchronous):
    async def solve_async(client, problem):
        return await asyncio.to_thread(solve, client.client, problem)

    engine = AnsweringEngine()
    batch = workflow(solve_async if asynchronous else solve).run(engine, PROBLEMS)
    assert batch.group_sizes.tolist() == [2, 2] and batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert engine.prompts == 8 and engine.calls <= 8  # two requests per episode, those at once in one call
    for row in range(4):
        turns = batch.turn_ids[row][batch.loss_mask[row]].unique().tolist()
        assert turns == [0, 1]  # the call and the answer, one sequence
        assert set(batch.versions[row][batch.loss_mask[row]].tolist()) == {5}
    assert "<tool_response>\n7\n</tool_response>" in batch.completions[0] and batch.completions[0].endswith(f"7{IM_END}")


def test_two_conversations_of_an_episode_are_two_samples_with_its_reward():
    def twice(client, problem):
        for question in ("1+1?", "2+2?"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}])
        return 0.5

    batch = workflow(twice).run(AnsweringEngine(), PROBLEMS[:1])
    assert batch.group_sizes.tolist() == [4] and batch.rewards.tolist() == [0.5] * 4


def test_episodes_in_flight_bound_how_many_play_at_once():
    for limit, expected in ((1, 1), (4, 4)):
        active, most = 0, 0

        async def slow(client, problem):
            nonlocal active, most
            active += 1
            most = max(most, active)
            await asyncio.sleep(0.05)
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
            active -= 1
            return 1.0

        engine = AnsweringEngine(delay=0.5)  # the others' requests arrive while the first samples
        workflow(slow, episodes_in_flight=limit).run(engine, PROBLEMS)
        assert most == expected and engine.prompts == 4
        # One at a time, one call per request; four at once, their requests in fewer calls.
        assert engine.calls == 4 if limit == 1 else engine.calls < 4


def raises(client, problem):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
    raise KeyError("tool 'calc' is not installed")


def hangs(client, problem):
    time.sleep(30)


def answers_text(client, problem):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
    return "yes"


def never_calls(client, problem):
    return 1.0


@pytest.mark.parametrize("agent,expected", [
    (raises, "agent raises raised KeyError: \"tool 'calc' is not installed\" on problem '3+4': fix the agent, or "
             "set data.on_invalid_reward=drop"),
    (hangs, "agent hangs ran past its timeout of 0.5 s on problem '3+4': fix the agent"),
    (never_calls, "agent never_calls made no call to the client (nothing to train on) on problem '3+4'"),
    (answers_text, "task 'agent-test' returned reward 'yes' for prompt '3+4' "),
])
def test_a_failed_episode_stops_the_run_in_one_line_or_drops_its_group(agent, expected):
    started = time.monotonic()
    with pytest.raises(RunStopped) as stopped:
        workflow(agent, timeout_s=0.5).run(AnsweringEngine(), PROBLEMS)
    assert str(stopped.value).startswith(expected) and "\n" not in str(stopped.value)
    batch = workflow(agent, timeout_s=0.5, on_invalid_reward="drop").run(AnsweringEngine(), PROBLEMS)
    assert all(math.isnan(r) for r in batch.rewards.tolist()) and batch.group_sizes.sum() == batch.num_rows
    assert time.monotonic() - started < 10  # a hung agent holds up neither run


def test_a_call_after_the_episode_ended_is_refused():
    kept = []

    def keeps_the_client(client, problem):
        kept.append(client)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
        return 1.0

    workflow(keeps_the_client).run(AnsweringEngine(), PROBLEMS[:1])
    with pytest.raises(ValueError, match="the episode has ended"):
        kept[0].chat.completions.create(model="policy", messages=[{"role": "user", "content": "2+2?"}])

"""Agents as tasks (lit_ppo.rollout.episodes.agent): sync and async agents through the OpenAI-compatible
client, their samples grouped by problem with the episode's reward, episodes in flight at once, and every
way an episode fails (raises, hangs, returns no reward, never calls), stopping the run or dropping the group."""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from lit_ppo.config import RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.episodes.agent import AgentWorkflow
from lit_ppo.tasks.base import Problem
from tests.unit.rollout.episodes.test_chat_client import CALC, IM_END, THINKING, TOOLS_CHATML, chatml_tokenizer

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


def workflow(agent, evaluating: bool = False, **settings) -> AgentWorkflow:
    params = SamplingParams(n=2, max_new_tokens=128, stop_token_ids=[TOK.eos_token_id], seed=1)
    return AgentWorkflow(TOK, AgentTask(agent), params, RolloutConfig(**settings), max_model_len=4096,
                         evaluating=evaluating)


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
    assert "<tool_response>\n7\n</tool_response>" in batch.completions[0]
    assert batch.completions[0].endswith(f"7{IM_END}")


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
    (raises, f"agent {__name__}.raises raised KeyError: \"tool 'calc' is not installed\" on problem '3+4': "
             "fix the agent, or set data.on_invalid_reward=drop"),
    (hangs, f"agent {__name__}.hangs ran past its timeout of 0.5 s on problem '3+4': fix the agent"),
    (never_calls, f"agent {__name__}.never_calls made no call to the client (nothing to train on) on problem '3+4'"),
    (answers_text, "task 'agent-test' returned reward 'yes' for prompt '3+4' "),
])
def test_a_failed_episode_stops_the_run_in_one_line_or_drops_its_group(agent, expected):
    started = time.monotonic()
    with pytest.raises(RunStopped) as stopped:
        workflow(agent, episode_timeout_s=0.5).run(AnsweringEngine(), PROBLEMS)
    # Every episode fails alike: the first to end names its problem.
    message = str(stopped.value).replace("'2*5'", "'3+4'")
    assert message.startswith(expected) and "\n" not in message
    batch = workflow(agent, episode_timeout_s=0.5, on_invalid_reward="drop").run(AnsweringEngine(), PROBLEMS)
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


THINKING_TOK = chatml_tokenizer(THINKING)


class ThinkingEngine:
    """Replies ``<think>hm</think>7`` to every prompt (the THINKING template drops the thinking later)."""

    version = 0

    def generate(self, prompts, params):
        ids = THINKING_TOK.encode("<think>hm</think>7", add_special_tokens=False) + [THINKING_TOK.eos_token_id]
        return [[Completion(ids, [-1.0] * len(ids), True, 0)] * params.n for _ in prompts]


def follows_up(client, problem):
    """Two calls of one conversation: under THINKING the second drifts."""
    messages = [{"role": "user", "content": problem.prompt}]
    first = client.chat.completions.create(model="policy", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "sure?"}]
    client.chat.completions.create(model="policy", messages=messages)
    return 1.0


def drifting_workflow(evaluating: bool = False, **settings) -> AgentWorkflow:
    params = SamplingParams(n=2, max_new_tokens=32, stop_token_ids=[THINKING_TOK.eos_token_id], seed=0)
    return AgentWorkflow(THINKING_TOK, AgentTask(follows_up), params, RolloutConfig(**settings), max_model_len=4096,
                         evaluating=evaluating)


def test_the_drift_rule_shares_the_reward_leaves_the_earlier_sample_out_or_stops_the_run():
    shared = drifting_workflow(on_drift="share").run(ThinkingEngine(), PROBLEMS[:1])
    assert shared.group_sizes.tolist() == [4] and shared.rewards.tolist() == [1.0] * 4
    assert shared.metrics == {"rollout/drifted_calls": 2.0}
    last = drifting_workflow(on_drift="last").run(ThinkingEngine(), PROBLEMS[:1])
    assert last.group_sizes.tolist() == [2] and last.metrics == {"rollout/drifted_calls": 2.0}
    # What stays is each episode's second call, prompted with the earlier turn as the template renders it.
    assert all(text.startswith("<think>hm</think>7") for text in last.completions)
    assert all("<think>" not in THINKING_TOK.decode(row[:20]) for row in last.input_ids)
    with pytest.raises(RunStopped, match=r"^agent tests\.unit\.rollout\.episodes\.test_agent\.follows_up made 1 "
                                         r"call\(s\) on problem '3\+4' whose chat template renders the earlier "
                                         r"turns differently \(data\.on_drift=error\)"):
        drifting_workflow(on_drift="error").run(ThinkingEngine(), PROBLEMS[:1])


def test_an_evaluation_keeps_one_row_per_episode_its_final_sample():
    batch = drifting_workflow(evaluating=True).run(ThinkingEngine(), PROBLEMS)
    assert batch.group_sizes.tolist() == [2, 2] and batch.num_rows == 4
    twice = workflow(TestTwoConversations.twice, evaluating=True).run(AnsweringEngine(), PROBLEMS[:1])
    assert twice.group_sizes.tolist() == [2]
    assert all(text.endswith(f"{IM_END}") for text in twice.completions)


class TestTwoConversations:
    @staticmethod
    def twice(client, problem):
        for question in ("1+1?", "2+2?"):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": question}])
        return 0.5


def over_http(client, problem):
    """The same episode through the real openai client over HTTP, at the episode's base_url and key."""
    import openai

    http = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    messages = [{"role": "user", "content": f"{problem.prompt}?"}]
    first = http.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    call = first.choices[0].message.tool_calls[0]
    value = str(eval(json.loads(call.function.arguments)["expression"]))
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": value}]
    final = http.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    return float(final.choices[0].message.content == problem.answer)


def test_an_agent_over_http_trains_as_one_calling_the_client_and_the_port_is_freed():
    seen = []

    def recording(client, problem):
        seen.append(client.base_url)
        return over_http(client, problem)

    direct = workflow(solve).run(AnsweringEngine(), PROBLEMS)
    http = workflow(recording).run(AnsweringEngine(), PROBLEMS)
    assert http.rewards.tolist() == direct.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert torch.equal(http.input_ids, direct.input_ids) and torch.equal(http.loss_mask, direct.loss_mask)
    assert torch.equal(http.turn_ids, direct.turn_ids)
    assert len(set(seen)) == 1  # one endpoint per run, an episode key each
    port = int(seen[0].rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_a_run_that_stops_frees_its_port_too():
    seen = []

    def fails(client, problem):
        seen.append(client.base_url)
        raise RuntimeError("broken tool")

    with pytest.raises(RunStopped):
        workflow(fails).run(AnsweringEngine(), PROBLEMS)
    port = int(seen[0].rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_a_key_of_an_ended_episode_is_refused_over_http():
    import openai

    keys, ended = {}, threading.Event()

    def first_or_second(client, problem):
        keys[problem.prompt] = (client.base_url, client.api_key)
        if problem is PROBLEMS[0]:
            reward = over_http(client, problem)
            threading.Timer(0.3, ended.set).start()  # the episode ends as this returns
            return reward
        assert ended.wait(10)
        url, key = keys[PROBLEMS[0].prompt]
        with pytest.raises(openai.NotFoundError, match="is unknown or has ended"):
            openai.OpenAI(base_url=url, api_key=key, max_retries=0).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "1+1?"}])
        return over_http(client, problem)

    params = SamplingParams(n=1, max_new_tokens=128, stop_token_ids=[TOK.eos_token_id], seed=1)
    batch = AgentWorkflow(TOK, AgentTask(first_or_second), params, RolloutConfig(), max_model_len=4096).run(
        AnsweringEngine(), PROBLEMS)
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert keys[PROBLEMS[0].prompt][1] != keys[PROBLEMS[1].prompt][1]


# docs/agents.md's agent written with OpenAI's Agents SDK (openai-agents) trains unchanged: its Runner calls the
# episode's endpoint with the real openai client, runs the tool the policy calls, and the episode's calls
# continue one token sequence (one sample, turns 0 and 1), rewarded by the agent.
DOC = (Path(__file__).resolve().parents[4] / "docs" / "agents.md").read_text()
(SDK_AGENT,) = [b for b in re.findall(r"```python\n(.*?)```", DOC, re.S) if "from agents import" in b]


def test_the_agents_sdk_agent_of_the_docs_calls_its_tool_and_trains_one_sequence_per_episode():
    scope: dict = {}
    exec(compile(SDK_AGENT, "docs/agents.md", "exec"), scope)
    params = SamplingParams(n=2, max_new_tokens=128, stop_token_ids=[TOK.eos_token_id], seed=1)
    problems = [Problem(p.prompt + "?", p.answer) for p in PROBLEMS]  # the scripted engine calls calc on "a+b?"
    batch = AgentWorkflow(TOK, AgentTask(scope["solve"]), params, RolloutConfig(), max_model_len=4096).run(
        AnsweringEngine(), problems)
    # The engine answers with the tool's result: right for 3+4 (7), wrong for 2*5 (the answer given is 11).
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0] and batch.group_sizes.tolist() == [2, 2]
    assert batch.metrics == {"rollout/drifted_calls": 0.0}
    for row in range(4):
        assert batch.turn_ids[row][batch.loss_mask[row]].unique().tolist() == [0, 1]
    text = TOK.decode(batch.input_ids[0][batch.attention_mask[0]])
    assert "Use calc for arithmetic." in text and '"name": "calc"' in text
    assert "<tool_response>\n7\n</tool_response>" in text
    assert torch.equal(batch.versions[batch.loss_mask].unique(), torch.tensor([5]))


def rewards_each_call(client, problem):
    """solve's two calls, each rewarded: 0.5 for calling the tool, 1.0 for the right answer."""
    reward = solve(client, problem)
    return {"turn_rewards": [0.5, reward]}


def test_rewards_of_each_call_make_each_call_a_sample_with_its_discounted_return():
    params = SamplingParams(n=2, max_new_tokens=128, stop_token_ids=[TOK.eos_token_id], seed=1)
    flow = AgentWorkflow(TOK, AgentTask(rewards_each_call), params, RolloutConfig(turn_discount=0.5),
                         max_model_len=4096)
    batch = flow.run(AnsweringEngine(), PROBLEMS)
    # Two calls per episode, two episodes per problem: four samples per group. G_1 = r_1, G_0 = 0.5 + 0.5 * G_1.
    assert batch.group_sizes.tolist() == [4, 4]
    assert batch.rewards.tolist() == [1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.5, 0.0]
    whole = workflow(solve).run(AnsweringEngine(), PROBLEMS)  # the same episodes, one sequence each
    for row in range(8):
        mask = batch.loss_mask[row]
        assert batch.turn_ids[row][mask].unique().tolist() == [0]  # each sample holds one call's completion
        length = int(batch.attention_mask[row].sum())
        episode = row // 2
        # The call's prompt and completion are the tokens of the whole episode's sequence up to its end.
        assert torch.equal(batch.input_ids[row][:length], whole.input_ids[episode][:length])
        expected = whole.loss_mask[episode][:length] & (whole.turn_ids[episode][:length] == row % 2)
        assert torch.equal(mask[:length], expected)
    evaluated = AgentWorkflow(TOK, AgentTask(rewards_each_call), params, RolloutConfig(turn_discount=0.5),
                              max_model_len=4096, evaluating=True).run(AnsweringEngine(), PROBLEMS)
    assert evaluated.rewards.tolist() == [1.0, 1.0, 0.5, 0.5]  # an episode scores its return, G_0


@pytest.mark.parametrize("returned, expected", [
    ({"reward": 1.0}, "returned a dict with keys ['reward']: return the episode's reward, or {'turn_rewards': "
                      "[one reward per call, in call order]}"),
    ({"turn_rewards": [1.0]}, "returned 1 turn rewards for 2 calls: give one per call, in call order"),
    ({"turn_rewards": "1"}, "returned a dict with keys ['turn_rewards']"),
    ({"turn_rewards": [1.0, "yes"]}, "task 'agent-test' returned reward 'yes' for prompt '"),  # either problem's
])
def test_a_malformed_dict_of_turn_rewards_fails_its_episode_in_one_line(returned, expected):
    def agent(client, problem):
        solve(client, problem)
        return returned

    with pytest.raises(RunStopped) as stopped:
        workflow(agent).run(AnsweringEngine(), PROBLEMS)
    assert expected in str(stopped.value) and "\n" not in str(stopped.value)
    batch = workflow(agent, on_invalid_reward="drop").run(AnsweringEngine(), PROBLEMS)
    assert all(math.isnan(r) for r in batch.rewards.tolist())


def test_each_sample_is_logged_under_its_problem_not_the_conversation_s_first_message():
    def with_an_example(client, problem):
        messages = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
                    {"role": "user", "content": f"{problem.prompt}?"}]
        client.chat.completions.create(model="policy", messages=messages)
        return 1.0

    batch = workflow(with_an_example).run(AnsweringEngine(), PROBLEMS)
    assert batch.prompts == ["3+4", "3+4", "2*5", "2*5"]


def overflows(client, problem):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 5000}])


def unknown_role(client, problem):
    client.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "1+1?"}])


def malformed_tool(client, problem):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}],
                                   tools=[{"name": "calc"}])


@pytest.mark.parametrize("agent, reason", [
    (overflows, "raised InvalidRequest: chat.completions.create: the conversation holds 5019 tokens and "
                "max_tokens=128, more than the model's 4096: shorten the messages or lower max_tokens"),
    (unknown_role, "raised InvalidRequest: chat.completions.create: messages[0] has role 'robot': must be one of "
                   "system, developer, user, assistant, tool"),
    (malformed_tool, "raised InvalidRequest: chat.completions.create: tools[0] is invalid: must be {'type': "
                     "'function', 'function': {'name': ..., 'parameters': {...}}}"),
])
def test_a_request_the_client_refuses_fails_the_episode_in_one_line_naming_agent_and_problem(agent, reason):
    with pytest.raises(RunStopped) as stopped:
        workflow(agent).run(AnsweringEngine(), PROBLEMS)
    # Every episode fails alike: the first to end names its problem.
    assert str(stopped.value) in [f"agent {__name__}.{agent.__name__} {reason} on problem {p.prompt!r}: fix the agent, "
                                  f"or set data.on_invalid_reward=drop to drop the groups of failed episodes"
                                  for p in PROBLEMS]
    batch = workflow(agent, on_invalid_reward="drop").run(AnsweringEngine(), PROBLEMS)
    assert all(math.isnan(r) for r in batch.rewards.tolist())

"""Episodes played by an agent: an ordinary function of an OpenAI-compatible client and a problem,
``def solve(client, problem)`` or ``async def solve(client, problem)``, returning the episode's reward.
The client (``lit_ppo.rollout.episodes.chat_client``) samples with the rollout engine and records every call on
token ids, so the agent's own code, written against the ``openai`` SDK, is what trains. An agent in
another process or framework talks to the same episode over HTTP: the real ``openai`` client with
``base_url=client.base_url, api_key=client.api_key`` (``lit_ppo.rollout.episodes.chat_endpoint``, one endpoint
per ``run`` on the loopback interface, closed when the run ends).

``params.n`` episodes per problem, at most ``episodes_in_flight`` at once, each with a fresh client and
``timeout_s`` seconds; the calls that episodes make at the same time are sampled in one engine call
(``lit_ppo.rollout.engines.shared``). Each token sequence of an episode is a sample (one when every call
continued the previous one; more where the agent started a new conversation, or where the template
rendered earlier turns differently, a drifted call). Every sample of an episode carries the episode's
reward, and a problem's group holds the samples of all its episodes. ``on_drift`` decides what a
drifted call does: 'share' keeps the sample it drifted from, 'last' leaves that one out, 'error' stops
the run; the batch's ``rollout/drifted_calls`` counts them. An agent may instead reward each call,
``{'turn_rewards': [r_0, r_1, ...]}`` (one per call that returned, in call order): each call is then a
sample of its own (its prompt, the earlier turns included, as context), with its return
``G_k = r_k + turn_discount * G_(k+1)``, as the agent exports of AReaL and SkyRL's step-wise samples do.
An agent that raises (``sys.exit()`` and KeyboardInterrupt included), runs past its timeout,
returns something that is not a reward or never calls the client fails its episode in one line naming
the agent, the problem and what to do; ``on_invalid_reward`` decides: stop the run ('error'), or drop
the problem's group ('drop'). The episodes' event loop runs in a thread of its own, watched
(``lit_ppo.utils.watched_loop``): an ``async def`` agent that blocks it past the timeout stops the run, and a
stop signal reaches the main thread at once.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import Completion, RolloutEngine, SamplingParams
from lit_ppo.rollout.engines.shared import SharedGenerate
from lit_ppo.rollout.episodes.chat_client import AsyncEngineChatClient, EngineChatClient
from lit_ppo.rollout.episodes.chat_endpoint import ChatEndpoint
from lit_ppo.rollout.episodes.episode import Episode, checked_reward, episodes_to_batch, turn_seed
from lit_ppo.tasks.agent import describe_agent
from lit_ppo.tasks.base import AgentTask, Problem, is_agent, task_name
from lit_ppo.utils.imports import describe
from lit_ppo.utils.text import shorten
from lit_ppo.utils.watched_loop import LoopBlocked, run_watched


class AgentFailed(Exception):
    """An episode the agent did not finish: its one line."""


class AgentWorkflow:
    """Episodes of an ``AgentTask``'s agent, laid out as a ``RolloutBatch`` (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer, with a chat template.
        task: an ``AgentTask``.
        params: the rollout's sampling parameters (``params.n`` episodes per problem).
        rollout: the rollout's settings: ``episodes_in_flight``, the most episodes played at once;
            ``episode_timeout_s``, the seconds an episode may take; ``tool_format``, the tool-call format of
            the client (``hermes``, ``json`` or ``auto``); ``on_drift``, what a drifted call does ('share',
            'last' or 'error', see the module docstring); ``turn_discount``: with per-turn rewards, a call's
            return is its reward plus this times the next call's; ``on_invalid_reward``, what a failed
            episode does ('error' stops the run, 'drop' drops its group).
        max_model_len: the most tokens one sequence may hold.
        evaluating: score episodes as an evaluation does: lay out only each episode's final sample (the
            sequence its last call ended), leaving out what a drifted call drifted from whatever
            ``on_drift`` says (as 'last' does), so that a drift never stops an evaluation.
    """

    def __init__(self, tokenizer, task: AgentTask, params: SamplingParams, rollout: RolloutConfig,
                 max_model_len: int, *, evaluating: bool = False):
        if not is_agent(task):
            raise TypeError(f"task {task_name(task)!r} has no agent(client, problem): it is not an agent task")
        self.tokenizer = tokenizer
        self.task = task
        self.params = params
        self.max_model_len = max_model_len
        self.episodes_in_flight = rollout.episodes_in_flight
        self.timeout_s = float(rollout.episode_timeout_s)
        self.tool_format = rollout.tool_format
        self.on_drift = "last" if evaluating else rollout.on_drift
        self.turn_discount = float(rollout.turn_discount)
        self.on_invalid_reward = rollout.on_invalid_reward
        self.one_row_per_episode = evaluating
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def run(self, engine: RolloutEngine, problems: list[Problem], *, seed: int | None = None) -> RolloutBatch:
        """Play ``params.n`` episodes per problem and lay their samples out, grouped by problem; the batch's
        ``metrics`` count the drifted calls (``rollout/drifted_calls``)."""
        base_seed = self.params.seed if seed is None else seed
        plays = [(problem, i * self.params.n + k) for i, problem in enumerate(problems) for k in range(self.params.n)]
        # The episodes' loop runs in a thread of its own, watched: an async agent that blocks it would hold back
        # every timeout on it. Each episode holds the endpoint itself: one abandoned in a blocked loop closes
        # its entry whenever it ends, on the closed endpoint.
        with ChatEndpoint() as endpoint:
            try:
                results = run_watched(self._play_all(engine, endpoint, plays, base_seed), self.timeout_s)
            except LoopBlocked:
                raise RunStopped(f"agent {describe_agent(self.task.agent)} blocked the event loop of its episodes "
                                 f"for more than data.episode_timeout_s={self.timeout_s:g} s (an async def agent "
                                 f"that calls time.sleep or blocking I/O), which stops every episode on it: await "
                                 f"instead (asyncio.sleep, an async client), or make it a plain def, which runs in "
                                 f"a thread of its own") from None
        episodes, group_sizes = [], []
        for i, problem in enumerate(problems):
            group = []
            for client, outcome in results[i * self.params.n:(i + 1) * self.params.n]:
                for episode, reward in self._samples(client, outcome, problem):
                    episode.prompt = problem.prompt  # not the conversation's first user message (an example)
                    episode.reward = reward
                    episode.completion = self._completion(episode)
                    group.append(episode)
            episodes += group
            group_sizes.append(len(group))
        batch = episodes_to_batch(episodes, group_sizes, self.pad_id)
        batch.metrics = {"rollout/drifted_calls": float(sum(client.drifted_calls for client, _ in results))}
        return batch

    def _samples(self, client: EngineChatClient, outcome: float | list[float],
                 problem: Problem) -> list[tuple[Episode, float]]:
        """The episode's samples and their rewards: with per-turn rewards (``outcome`` the calls' returns)
        each call is a sample with its return; otherwise each token sequence (see the module docstring)
        with the episode's reward. An evaluation's row is the final sequence, with the episode's return."""
        if isinstance(outcome, list) and not self.one_row_per_episode:
            return [(episode, value) for turn, value in zip(client.turns, outcome, strict=True) for episode in turn]
        reward = outcome[0] if isinstance(outcome, list) else outcome
        samples = client.episodes(drifted=self.on_drift != "last") or [_empty(problem)]
        return [(episode, reward) for episode in (samples[-1:] if self.one_row_per_episode else samples)]

    async def _play_all(self, engine: RolloutEngine, endpoint: ChatEndpoint, plays: list[tuple[Problem, int]],
                        seed: int | None) -> list[tuple[EngineChatClient, float | list[float]]]:
        slots = asyncio.Semaphore(self.episodes_in_flight)
        shared = SharedGenerate(engine)  # what the episodes' calls send at once, the engine samples in one call

        async def play(problem: Problem, index: int) -> tuple[EngineChatClient, float | list[float]]:
            params = replace(self.params, n=1, seed=turn_seed(seed, index))
            client = EngineChatClient(shared, self.tokenizer, params, self.max_model_len, self.tool_format)
            async with slots:
                client.base_url, client.api_key = endpoint.url, endpoint.open(client)
                try:
                    value = await asyncio.wait_for(self._played(client, problem), self.timeout_s)
                    if not client.episodes():
                        raise AgentFailed("made no call to the client (nothing to train on)")
                except AgentFailed as e:
                    return client, self._failed(problem, str(e))
                except asyncio.TimeoutError:
                    return client, self._failed(problem, f"ran past its timeout of {self.timeout_s:g} s")
                finally:
                    endpoint.close_episode(client.api_key)
                    client.close()
            if client.drifted_calls and self.on_drift == "error":
                raise RunStopped(f"agent {describe_agent(self.task.agent)} made {client.drifted_calls} call(s) on "
                                 f"problem {shorten(problem.prompt, 80)!r} whose chat template renders the earlier "
                                 f"turns differently (data.on_drift=error): keep the conversation as the client "
                                 f"returned it, or set data.on_drift=share or last")
            text = self._completion(client.episodes()[-1])
            if isinstance(value, Mapping):
                return client, self._turn_returns(value, client, problem, text)
            return client, checked_reward(value, task=task_name(self.task), prompt=problem.prompt, completion=text,
                                          on_invalid=self.on_invalid_reward)

        return list(await asyncio.gather(*(play(problem, index) for problem, index in plays)))

    async def _played(self, client: EngineChatClient, problem: Problem) -> Any:
        """The agent's return value for one episode; AgentFailed for an exception it raised."""
        try:
            if inspect.iscoroutinefunction(self.task.agent):
                return await self.task.agent(AsyncEngineChatClient(client=client), problem)
            return await _in_thread(self.task.agent, client, problem)
        except (Exception, SystemExit, KeyboardInterrupt) as e:
            # sys.exit() or KeyboardInterrupt in an agent ends its episode, not the run: a stop signal never
            # raises there (the episodes' loop and the agents' threads are not the main thread).
            raise AgentFailed(f"raised {describe(e)}") from e

    def _turn_returns(self, value: Mapping, client: EngineChatClient, problem: Problem,
                      text: str) -> float | list[float]:
        """The return of each call, ``G_k = r_k + turn_discount * G_(k+1)``, of an agent's
        ``{'turn_rewards': [r_0, r_1, ...]}`` (one reward per call that returned, in call order); NaN or
        RunStopped (``on_invalid_reward``) for a dict of another shape or a reward that is not a number."""
        if set(value) != {"turn_rewards"} or isinstance(value["turn_rewards"], (str, bytes)) or \
                not isinstance(value["turn_rewards"], Sequence):
            return self._failed(problem, f"returned a dict with keys {sorted(map(str, value))}: return the episode's "
                                         f"reward, or {{'turn_rewards': [one reward per call, in call order]}}")
        rewards = list(value["turn_rewards"])
        if len(rewards) != len(client.turns):
            return self._failed(problem, f"returned {len(rewards)} turn rewards for {len(client.turns)} calls: give "
                                         f"one per call, in call order")
        checked = [checked_reward(r, task=task_name(self.task), prompt=problem.prompt, completion=text,
                                  on_invalid=self.on_invalid_reward) for r in rewards]
        if any(math.isnan(r) for r in checked):
            return math.nan
        returns, following = [], 0.0
        for reward in reversed(checked):
            following = reward + self.turn_discount * following
            returns.append(following)
        return returns[::-1]

    def _failed(self, problem: Problem, what: str) -> float:
        """NaN (the group is dropped) with on_invalid_reward='drop'; else RunStopped in one line."""
        if self.on_invalid_reward == "drop":
            return math.nan
        raise RunStopped(f"agent {describe_agent(self.task.agent)} {what} on problem {shorten(problem.prompt, 80)!r}: "
                         f"fix the agent, or set data.on_invalid_reward=drop to drop the groups of failed episodes")

    def _completion(self, episode: Episode) -> str:
        """The episode's text after its first context (every turn, markup included), for logs."""
        tokens = [t for segment in episode.segments[1:] for t in segment.token_ids]
        return self.tokenizer.decode(tokens, skip_special_tokens=False)


def _in_thread(function, *args: Any) -> asyncio.Future:
    """``function(*args)`` in a daemon thread of its own: a sync agent that hangs past its timeout is left
    behind without holding up the rollout or the process's exit (an executor's threads would)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(method, value) -> None:
        if not future.done():
            method(value)

    def target() -> None:
        try:
            result = function(*args)
        except BaseException as e:  # delivered to the awaiting episode
            outcome = (future.set_exception, e)
        else:
            outcome = (future.set_result, result)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the rollout has ended (its loop closed): nobody waits for this episode
            pass

    threading.Thread(target=target, name="lit_ppo-agent", daemon=True).start()
    return future


def _empty(problem: Problem) -> Episode:
    """The sample of a failed episode that made no call: one context token, nothing generated (its NaN
    reward drops the group)."""
    episode = Episode(prompt=problem.prompt)
    episode.add_context([0])
    episode.add_generation(Completion([0], [0.0], True, -1))
    return episode

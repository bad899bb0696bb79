"""The multi-turn workflow: episodes that alternate the policy's turns with an environment's (a tool, a
user, a grader), for a task that provides ``environment(problem)`` (``lit_ppo.tasks.base.MultiTurnTask``).
Every turn samples all running episodes in one engine call, with a seed of its own (``turn_seed``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams
from lit_ppo.rollout.episodes import conversation
from lit_ppo.rollout.episodes.episode import Episode, checked_reward, episodes_to_batch, turn_seed
from lit_ppo.tasks.base import Environment, MultiTurnTask, Problem, is_multi_turn, task_name


@dataclass
class _Running:
    """Bookkeeping of one episode while it runs."""

    episode: Episode
    env: Environment
    token_ids: list[int]
    """Everything so far (the next prompt, once it ends with the generation prompt)."""
    prompt_len: int
    reward: float = 0.0
    turns: int = 0
    done: bool = False


class MultiTurnWorkflow:
    """Episodes that alternate assistant turns with environment turns, on token ids throughout.

    Each episode starts with the chat-templated first user message (``env.start()``). Every turn, all
    still-running episodes go to the engine in ONE ``generate`` call (n=1 each; the prompt is the
    episode's token ids so far, never re-tokenised), the completion's ids are appended verbatim, the
    environment sees its text and answers; its feedback is appended as a chat-templated user turn
    followed by the assistant generation prompt (context: loss mask 0, turn id -1). An episode ends
    when the environment returns no feedback, after ``max_turns`` assistant turns, or when a turn is
    truncated (hit ``max_new_tokens`` without a stop token). Its reward is the environment's last
    reported reward times ``turn_discount ** (turns - 1)``; the trainer places it on the last
    generated token, and ``episodes_to_batch`` numbers the turns 0, 1, 2, ...

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        task: a ``MultiTurnTask`` (its ``environment(problem)`` drives each episode).
        params: sampling parameters of every turn; ``params.n`` episodes per problem (each turn then
            asks for n=1 per episode), ``params.seed`` the default seed.
        rollout: the rollout's settings: ``max_turns``, the most assistant turns per episode;
            ``turn_discount``, the factor applied to the reward once per assistant turn after the first;
            ``system_prompt``, an optional system message before the first user message; and
            ``on_invalid_reward``: a reported reward that is not a finite real number (``reward_problem``)
            raises a ValueError naming the task, the first user message and the value ('error'), or ends
            the episode with reward NaN ('drop') so that the collector drops its group.
    """

    def __init__(self, tokenizer, task: MultiTurnTask, params: SamplingParams, rollout: RolloutConfig):
        if not is_multi_turn(task):
            raise TypeError(f"task {getattr(task, 'name', task)!r} has no environment(problem): it is not multi-turn")
        self.on_invalid_reward = rollout.on_invalid_reward
        self.tokenizer = tokenizer
        self.task = task
        self.params = params
        self.max_turns = rollout.max_turns
        self.turn_discount = float(rollout.turn_discount)
        self.system_prompt = rollout.system_prompt
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._assistant_close, self._feedback_open, self._feedback_close = self._template_parts()

    def _messages(self, *turns: tuple[str, str]) -> list[dict[str, str]]:
        messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return messages + [{"role": role, "content": content} for role, content in turns]

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)

    def _template_parts(self) -> tuple[str, str, str]:
        """What the chat template writes after an assistant message's content, and around a user
        message that follows it (up to and including the generation prompt), read off two renders
        of one conversation. Rendering only the new messages would be wrong for templates that add
        a default system prompt or a BOS to every render."""
        exchange = (("user", conversation.SENTINEL_USER), ("assistant", conversation.SENTINEL_ASSISTANT))
        before = self._render(self._messages(*exchange), False)
        after = self._render(self._messages(*exchange, ("user", conversation.SENTINEL_USER)), True)
        close, tail = conversation.assistant_close(before), conversation.appended(before, after)
        if close is None or tail is None:
            raise ValueError("the tokenizer's chat template does not render a conversation as a prefix of its "
                             "continuation, which multi-turn rollouts on token ids need")
        if tail.count(conversation.SENTINEL_USER) != 1:
            raise ValueError("the tokenizer's chat template does not render a user message's content verbatim")
        feedback_open, feedback_close = tail.split(conversation.SENTINEL_USER)
        return close, feedback_open, feedback_close

    def prompt_ids(self, message: str) -> list[int]:
        """Token ids of the chat-templated first user message, ending with the assistant generation prompt."""
        return list(self.tokenizer.apply_chat_template(self._messages(("user", message)), add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))

    def feedback_ids(self, feedback: str, completion_ids: list[int]) -> list[int]:
        """Token ids to append after an assistant turn ``completion_ids`` so that the episode continues with
        the user message ``feedback`` and the assistant generation prompt: the template's closing of the
        assistant message (less the stop token the policy already generated), the user turn, the
        generation prompt. Earlier tokens are never re-tokenised."""
        return conversation.continuation_ids(self.tokenizer, self._assistant_close, completion_ids,
                                             self._feedback_open + feedback + self._feedback_close)

    def run(self, engine: RolloutEngine, problems: list[Problem], *, seed: int | None = None) -> RolloutBatch:
        """Play ``params.n`` episodes per problem (groups in problem order) and lay them out.

        ``seed`` replaces ``params.seed`` for this call; turn k samples with ``turn_seed(seed, k)``.
        """
        base_seed = self.params.seed if seed is None else seed
        states: list[_Running] = []
        for problem in problems:
            for _ in range(self.params.n):
                env = self.task.environment(problem)
                first = env.start()
                prompt = self.prompt_ids(first)
                episode = Episode(prompt=first)
                episode.add_context(prompt)
                states.append(_Running(episode, env, list(prompt), len(prompt)))

        for turn in range(self.max_turns):
            running = [s for s in states if not s.done]
            if not running:
                break
            params = replace(self.params, n=1, seed=turn_seed(base_seed, turn))
            outputs = engine.generate([s.token_ids for s in running], params)
            if len(outputs) != len(running):
                raise ValueError(f"engine returned completions for {len(outputs)} prompts, expected {len(running)}")
            for state, completions in zip(running, outputs):
                if len(completions) != 1:
                    raise ValueError(f"engine returned {len(completions)} completions for a prompt, expected n=1")
                completion = completions[0]
                state.episode.add_generation(completion)
                state.token_ids += completion.token_ids
                state.turns += 1
                text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                feedback, reward = state.env.step(text)
                if reward is not None:
                    state.reward = checked_reward(reward, task=task_name(self.task), prompt=state.episode.prompt,
                                                  completion=text, on_invalid=self.on_invalid_reward)
                # An invalid (NaN) reward ends the episode: its group is dropped whatever comes later.
                if feedback is None or not completion.stopped or state.turns == self.max_turns \
                        or math.isnan(state.reward):
                    state.done = True
                    continue
                context = self.feedback_ids(feedback, completion.token_ids)
                state.episode.add_context(context)
                state.token_ids += context

        episodes = []
        for state in states:
            episode = state.episode
            episode.reward = state.reward * self.turn_discount ** (state.turns - 1)
            # The whole exchange after the prompt, markup included, for logs.
            episode.completion = self.tokenizer.decode(state.token_ids[state.prompt_len:], skip_special_tokens=False)
            episodes.append(episode)
        return episodes_to_batch(episodes, [self.params.n] * len(problems), self.pad_id)

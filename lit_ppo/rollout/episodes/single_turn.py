"""The single-turn workflow (RLVR): a chat-templated prompt, ``params.n`` completions, the task's reward."""

from __future__ import annotations

from dataclasses import replace

from lit_ppo.config.rollout import RolloutConfig
from lit_ppo.rollout.batch import RolloutBatch
from lit_ppo.rollout.engines.protocol import RolloutEngine, SamplingParams
from lit_ppo.rollout.episodes.episode import Episode, batch_rewards, checked_reward, episodes_to_batch
from lit_ppo.tasks.base import Problem, Task, task_name


class SingleTurnWorkflow:
    """RLVR with one assistant turn: chat-templated prompt -> ``params.n`` completions -> task reward.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        task: scores decoded completions and may restrict their tokens.
        params: sampling parameters of every request, used as given (the caller decides whether the
            task's ``allowed_completion_tokens`` restrict them, since the trainer must apply the same
            restriction to its log-probs).
        rollout: the rollout's settings: ``system_prompt``, an optional system message placed before the
            user message, and ``on_invalid_reward``: a reward that is not a finite real number
            (``reward_problem``) raises a ValueError naming the task, prompt and value ('error'), or
            becomes NaN ('drop') so that the collector drops its group.
    """

    def __init__(self, tokenizer, task: Task, params: SamplingParams, rollout: RolloutConfig):
        self.tokenizer = tokenizer
        self.task = task
        self.system_prompt = rollout.system_prompt
        self.params = params
        self.on_invalid_reward = rollout.on_invalid_reward
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def prompt_ids(self, problem: Problem) -> list[int]:
        """Token ids of the chat-templated prompt, ending with the assistant generation prompt: the
        problem's ``messages`` if it has them (``system_prompt`` goes first unless they hold a system
        message), else ``system_prompt`` and the user message ``prompt``."""
        if problem.messages is not None:
            messages = [dict(m) for m in problem.messages]
            if self.system_prompt is not None and not any(m.get("role") == "system" for m in messages):
                messages.insert(0, {"role": "system", "content": self.system_prompt})
        else:
            messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
            messages.append({"role": "user", "content": problem.prompt})
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def run(self, engine: RolloutEngine, problems: list[Problem], *, seed: int | None = None) -> RolloutBatch:
        """Generate, score and lay out ``params.n`` samples per problem (groups in problem order).

        ``seed`` replaces ``params.seed`` for this call: a collector passes a different one per
        iteration, since reusing one seed would resample the same random streams every step.
        """
        params = self.params if seed is None else replace(self.params, seed=seed)
        prompts = [self.prompt_ids(p) for p in problems]
        groups = engine.generate(prompts, params)
        for completions in groups:
            if len(completions) != params.n:
                raise ValueError(f"engine returned {len(completions)} completions for a prompt, expected n={params.n}")
        texts_of = [[self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group] for group in groups]
        episodes = []
        for problem, prompt, completions, texts, scores in zip(problems, prompts, groups, texts_of,
                                                               batch_rewards(self.task, problems, groups, texts_of),
                                                               strict=True):
            for i, (completion, text, value) in enumerate(zip(completions, texts, scores.rewards, strict=True)):
                reward = checked_reward(value, task=task_name(self.task), prompt=problem.prompt, completion=text,
                                        on_invalid=self.on_invalid_reward)
                episode = Episode(prompt=problem.prompt, completion=text, reward=reward,
                                  reward_terms={name: values[i] for name, values in scores.terms.items()})
                episode.add_context(prompt)
                episode.add_generation(completion)
                episodes.append(episode)
        return episodes_to_batch(episodes, [params.n] * len(problems), self.pad_id)

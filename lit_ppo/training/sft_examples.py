"""The examples of ``python -m lit_ppo sft``: a task's problems (the same ``data`` group as ``fit``), each
with its completion, as token ids and the mask of the tokens the loss counts; read and tokenised without
Lightning or torch, so that the check before a run refuses bad data before either loads.

An example's prompt is tokenised exactly as a rollout tokenises it (``data.system_prompt``, then the
problem's messages or its prompt as the user message, through the chat template with the generation
prompt), so that the fine-tuned model meets its prompts in RL as it met them here. Its completion is:

- a completion column (``sft.completion_key``) holding a string: its tokens follow the prompt, closed by the
  tokenizer's EOS, as a sampled completion ends; the loss counts these tokens;
- that column holding a list of assistant messages (TRL's conversational prompt-completion), or a prompt
  of chat messages with assistant messages and no completion (a conversation, TRL's ``messages``): the
  conversation runs through the chat template and the loss counts each trained assistant message's
  tokens, its end-of-turn included;
- else ``sft.completion_template`` formatted with the problem's ``answer``, ``prompt`` and columns.

A problem with none of these, an example longer than ``sft.max_length`` and a chat template that renders
earlier messages differently once later ones follow are refused in one line naming the row where its user
finds it (``train.jsonl line 14``, ``data.task=arithmetic problems('train')[3]``): nothing is dropped or cut
silently."""


from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from lit_ppo.config.sft import SFTConfig
from lit_ppo.tasks import build_task
from lit_ppo.tasks.base import Problem
from lit_ppo.tasks.dataset import PREFIX, held_out_split, read_rows, row_places, rows_to_problems


@dataclass(frozen=True)
class SFTExample:
    """One tokenised example."""

    input_ids: tuple[int, ...]
    """The prompt's and the completion's tokens."""
    loss_mask: tuple[bool, ...]
    """True on the tokens the loss counts (each predicted from the tokens before it)."""


class SFTProblem(NamedTuple):
    """A problem to fine-tune on, and where its user finds it."""

    problem: Problem
    where: str
    """Its row as the user sees it: ``train.jsonl line 14``, ``data.task=arithmetic problems('train')[3]``."""


def sft_problems(task: str, task_kwargs: dict[str, Any] | None) -> dict[str, list[SFTProblem]]:
    """``{'train': ..., 'test': ...}`` problems of the ``data`` section's task, each with where it is.
    ``data=dataset`` reads its files' rows as they are (a prompt column, or ``messages`` where the rows have no
    prompt column), without setting up its rewards: each is the line (or row) of its file, the test fraction
    held out included; any other task gives its own problems, each its index in ``problems(split)``."""
    kwargs = dict(task_kwargs or {})
    if task != "dataset":
        built = build_task(task, **kwargs)
        return {split: [SFTProblem(p, f"data.task={task} problems({split!r})[{i}]")
                        for i, p in enumerate(built.problems(split))] for split in ("train", "test")}
    if kwargs.get("train_path") is None:
        raise ValueError(f"{PREFIX}train_path is required: give {PREFIX}train_path=<file>")
    prompt_key = kwargs.get("prompt_key") or "prompt"

    def load(key: str) -> list[SFTProblem]:
        path = os.fspath(kwargs[key])
        rows = read_rows(path, key)
        column = prompt_key if prompt_key in rows[0] or "messages" not in rows[0] else "messages"
        problems = rows_to_problems(rows, path, column, kwargs.get("answer_key"), None, key)
        return [SFTProblem(*pair) for pair in zip(problems, row_places(path, len(rows)))]

    train = load("train_path")
    if kwargs.get("test_path") is not None:
        return {"train": train, "test": load("test_path")}
    # The held-out split keeps the problems themselves, in order: each finds its place again by identity.
    where = {id(p.problem): p.where for p in train}
    splits = held_out_split(tuple(p.problem for p in train), kwargs.get("test_fraction"), kwargs.get("seed", 0),
                            kwargs["train_path"])
    return {split: [SFTProblem(p, where[id(p)]) for p in problems]
            for split, problems in zip(("train", "test"), splits)}


def _prompt_messages(problem: Problem, system_prompt: str | None) -> list[dict]:
    """The messages a rollout templates for ``problem`` (``lit_ppo.rollout.episodes.single_turn``' rule)."""
    if problem.messages is not None:
        messages = [dict(m) for m in problem.messages]
        if system_prompt is not None and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages
    return [*([{"role": "system", "content": system_prompt}] if system_prompt is not None else []),
            {"role": "user", "content": problem.prompt}]


def _template(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                              return_dict=False))


def _completion(problem: Problem, cfg: SFTConfig, where: str) -> str | list[dict] | None:
    """The problem's completion (a string, or assistant messages), or None for a conversation whose own
    assistant messages are trained."""
    if cfg.completion_key in problem.columns:
        value = problem.columns[cfg.completion_key]
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            value = [value]
        if (isinstance(value, list) and value and all(isinstance(m, dict) and m.get("role") == "assistant"
                                                     and isinstance(m.get("content"), str) for m in value)):
            return [dict(m) for m in value]
        raise ValueError(f"{where}, column {cfg.completion_key!r}: {type(value).__name__} is not a string or a list "
                         f"of assistant messages {{role: assistant, content}}")
    if cfg.completion_template is not None:
        try:
            return cfg.completion_template.format(answer=problem.answer, prompt=problem.prompt,
                                                  **{k: v for k, v in problem.columns.items() if isinstance(k, str)})
        except (KeyError, IndexError) as e:
            raise ValueError(f"sft.completion_template={cfg.completion_template!r}: {where} has no field {e}: "
                             f"answer, prompt and the columns ({', '.join(problem.columns) or 'none'}) are "
                             f"there") from None
    if problem.messages is not None and any(m.get("role") == "assistant" for m in problem.messages):
        return None
    columns = ", ".join(problem.columns) or "none"
    raise ValueError(f"{where} has no completion: give a {cfg.completion_key!r} column (sft.completion_key; its "
                     f"columns: {columns}), assistant messages in its prompt, or sft.completion_template "
                     f"(e.g. '<answer>{{answer}}</answer>')")


def tokenize(tokenizer, problem: Problem, cfg: SFTConfig, system_prompt: str | None, where: str) -> SFTExample:
    """The example of ``problem`` (the module docstring's rules); ValueError of one line naming ``where``."""
    completion = _completion(problem, cfg, where)
    messages = _prompt_messages(problem, system_prompt)
    if isinstance(completion, str):
        prompt = _template(tokenizer, messages, True)
        answer = list(tokenizer.encode(completion, add_special_tokens=False)) + [tokenizer.eos_token_id]
        ids, mask = prompt + answer, [False] * len(prompt) + [True] * len(answer)
    else:
        trained = range(len(messages), len(messages) + len(completion)) if completion else \
            [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        messages = messages + (completion or [])
        ids, mask = [], []
        for i in range(len(messages)):
            before = _template(tokenizer, messages[:i], True) if i in trained else ids
            after = _template(tokenizer, messages[:i + 1], False)
            if before[:len(ids)] != ids or after[:len(before)] != before:
                raise ValueError(f"{where}: the chat template renders the messages before message {i} differently "
                                 f"once it follows (a template that rewrites earlier turns): give the example as a "
                                 f"prompt and a completion")
            mask += [False] * (len(before) - len(ids)) + [i in trained] * (len(after) - len(before))
            ids = after
        if not any(mask):
            raise ValueError(f"{where}: its assistant messages have no tokens to train on")
    if len(ids) > cfg.max_length:
        raise ValueError(f"{where} is {len(ids)} tokens, more than sft.max_length={cfg.max_length}: raise "
                         f"sft.max_length, or shorten the example")
    return SFTExample(tuple(ids), tuple(mask))


def sft_examples(tokenizer, problems: Sequence[SFTProblem], cfg: SFTConfig,
                 system_prompt: str | None) -> list[SFTExample]:
    """Every problem as an example, in order, a refusal naming where the problem is."""
    return [tokenize(tokenizer, p.problem, cfg, system_prompt, p.where) for p in problems]


class SFTExamples:
    """The train and test problems of the ``data`` section with their completions, checked when read (a
    problem without a completion is one line naming its row) and tokenised by ``tokenize``.

    Args:
        task: the registered task or dotted path (``data.task``).
        task_kwargs: its settings (``data.task_kwargs``).
        sft: the ``sft`` section.
        system_prompt: ``data.system_prompt``.
    """

    def __init__(self, task: str, task_kwargs: dict | None, sft: SFTConfig, system_prompt: str | None = None):
        self.cfg, self.system_prompt = sft, system_prompt
        self.problems = sft_problems(task, task_kwargs)
        if not self.problems["train"]:
            raise ValueError(f"data.task={task!r} has no training problems")
        for problems in self.problems.values():
            for problem, where in problems:
                _completion(problem, sft, where)
        self.examples: dict[str, list[SFTExample]] = {}

    def tokenize(self, tokenizer) -> None:
        """Tokenise both splits with ``tokenizer`` (the policy's, with its chat template) into ``examples``."""
        for split, problems in self.problems.items():
            self.examples[split] = sft_examples(tokenizer, problems, self.cfg, self.system_prompt)

"""``judge``: an LLM that grades each completion, the reward being its verdict (LLM-as-a-judge).

Set up by ``data.task_kwargs.judge`` (``JudgeConfig``). The judge reads a user message made from
``template`` (the prompt, the completion and the gold answer substituted), after an optional ``system``
message, and replies; the last match of the regular expression ``verdict`` in the reply is the verdict,
mapped to a reward by ``labels`` (or, without labels, read as a number). A reply without a verdict, or
with one that is not a label or not a number, gives an invalid reward (``NoVerdict``), which
``data.on_invalid_reward`` handles: stop the run, or drop the prompt group.

The judge is either

- an OpenAI-compatible endpoint (``base_url``, e.g. ``vllm serve``), probed when the settings are
  checked (``GET /models``: it answers and serves ``model``; by the standard library, the ``openai``
  client loading at the first scoring); a group's completions are judged by as many requests at once,
  and a request that still fails after the client's retries stops the run in one line;
- or a local Hugging Face causal LM, loaded at the first scoring and run in this process by transformers'
  ``generate`` (greedy at temperature 0, else sampled with the model's generation config at that
  temperature); the completions of every group judged at once are generated together (``BatchedCalls``).

A call returns a coroutine: ``score_calls`` awaits the judge's calls of a batch together.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import re
import string
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from lit_ppo.config.checks import as_config, check_fields, check_number, check_positive_int, fail
from lit_ppo.tasks.rewards.batching import BatchedCalls
from lit_ppo.tasks.rewards.calls import completion_text
from lit_ppo.tasks.rewards.model import check_device, model_device
from lit_ppo.utils.imports import describe
from lit_ppo.utils.text import first_line

if TYPE_CHECKING:  # openai, torch and the models load where the judge is asked or loads: a task is built without them
    import openai

JUDGE = "judge"
"""The entry of ``reward_fns`` that is the judge."""

PLACEHOLDERS = ("prompt", "completion", "answer")
"""What ``JudgeConfig.template`` may substitute."""

DEFAULT_TEMPLATE = """\
Grade an answer to a problem against the reference answer.

Problem:
{prompt}

Reference answer:
{answer}

Answer to grade:
{completion}

The answer is correct if its final result is the reference's; wording, format and working may differ. \
Reason briefly, then write your verdict as the last line, exactly `VERDICT: correct` or `VERDICT: incorrect`."""


@dataclass
class JudgeConfig:
    """``data.task_kwargs.judge``: the judge model, its endpoint, its prompt and how its reply is read."""

    model: str
    """The model name the endpoint serves; without ``base_url``, a local Hugging Face causal LM directory
    (or the hub id of one in the local Hugging Face cache), run by the judge's own engine in this process."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint, ``http://host:port/v1`` (``vllm serve``, SGLang, ...); None: the local model."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the endpoint's key (the config, which is logged, never holds it);
    unset: the key "EMPTY", which vLLM's server accepts."""
    template: str = DEFAULT_TEMPLATE
    """The judge's user message: a ``str.format`` template of ``{prompt}`` (the user message), ``{completion}``
    and ``{answer}`` (the gold answer column); literal braces doubled (``{{``, ``}}``)."""
    system: str | None = None
    """A system message before it; None: none."""
    verdict: str = r"VERDICT:\s*(correct|incorrect)\b"
    """A regular expression (case ignored) whose first group captures the verdict; the last match in the
    reply counts, since judges reason first."""
    labels: dict[str, float] | None = field(default_factory=lambda: {"correct": 1.0, "incorrect": 0.0})
    """Verdict (case and surrounding spaces ignored) -> reward; None: the verdict is a number (a 0-10
    score, ...), the reward as is."""
    max_tokens: int = 512
    """The most tokens of one reply."""
    temperature: float = 0.0
    """The judge's sampling temperature; 0: greedy."""
    timeout_s: float = 60.0
    """Seconds one request to the endpoint may take, per try (and the start's probe); the local model has none."""
    device: str = "auto"
    """Where the local model runs: ``auto`` (this rank's CUDA device if there is one, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N``; unused with ``base_url``."""
    max_retries: int = 2
    """Tries after the first of a request that failed to connect, timed out or got a retryable HTTP status
    (429, 5xx): the ``openai`` client's own retry."""


class NoVerdict:
    """An invalid reward: what the judge's reply gives when no verdict can be read from it. Not a number, so
    the workflow applies ``data.on_invalid_reward``; its repr, short, says why."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"<{self.why}>"


def _cut(text: str, limit: int = 16) -> str:
    """``repr(text)`` cut to ``limit`` characters, so that a ``NoVerdict``'s repr stays under 40."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def _prompt_text(prompt: Any) -> str:
    """The prompt's text: a string as is, chat messages as the last user message's content."""
    if isinstance(prompt, (list, tuple)):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt)


class LLMJudge:
    """The ``judge`` reward function: ``await judge(prompts=, completions=, answer=)`` gives one value per
    completion, a float or ``NoVerdict``. Built by ``from_settings``."""

    def __init__(self, config: JudgeConfig, where: str):
        self.config = config
        self.where = where
        self.needs_answer = "answer" in _placeholders(config.template)
        """The template shows the gold answer: the dataset needs its answer column."""
        self._verdict = re.compile(config.verdict, re.IGNORECASE)
        self._labels = None if config.labels is None else {
            k.strip().lower(): float(v) for k, v in config.labels.items()}
        self._api_key = os.environ.get(config.api_key_env) or "EMPTY"
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._local: tuple[Any, Any] | None = None
        self._batched = BatchedCalls(self._generate)
        self._load_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any, where: str) -> LLMJudge:
        """The judge of the settings ``settings`` (the mapping ``where``); ValueError in one line naming the key
        for a bad setting, an endpoint that does not answer or does not serve ``model``, or a local ``model``
        that is not a causal LM directory. Nothing loads here."""
        allowed = ", ".join(f.name for f in fields(JudgeConfig))
        if not isinstance(settings, Mapping):
            fail(where, settings, f"a mapping of judge settings ({allowed})")
        if "model" not in settings:  # as_config would raise a TypeError
            raise ValueError(f"{where}.model is missing: the model name the endpoint at {where}.base_url serves, "
                             f"or a local causal LM directory")
        config = as_config(JudgeConfig, where, dict(settings))
        check_fields(config, where)
        _check(config, where)
        judge = cls(config, where)
        if config.base_url is None:
            from lit_ppo.models import model_dir_problem

            problem = model_dir_problem(config.model)
            if problem is not None:
                raise ValueError(f"{where}.model={config.model!r} {problem} (without {where}.base_url the judge is "
                                 f"a local causal LM)")
        else:
            judge._probe()
        return judge

    async def __call__(self, prompts: list, completions: list, answer: list | None = None, **kwargs) -> list:
        """The verdict's reward of each completion (``NoVerdict`` where none can be read), TRL's keywords."""
        answers = [""] * len(completions) if answer is None else answer
        conversations = [self.messages(p, c, a) for p, c, a in zip(prompts, completions, answers, strict=True)]
        if self.config.base_url is None:
            replies = await self._batched(conversations)
        else:
            replies = await asyncio.gather(*(self._request(m) for m in conversations))
        return [self.reward(reply) for reply in replies]

    def messages(self, prompt: Any, completion: Any, answer: Any) -> list[dict[str, str]]:
        """The chat messages the judge reads for one completion."""
        text = self.config.template.format(prompt=_prompt_text(prompt), completion=completion_text(completion),
                                           answer=answer)
        system = [] if self.config.system is None else [{"role": "system", "content": self.config.system}]
        return [*system, {"role": "user", "content": text}]

    def reward(self, reply: str) -> float | NoVerdict:
        """The reward of the verdict in ``reply``: its last match's first group, mapped by ``labels`` or read
        as a number."""
        verdicts = [m.group(1) for m in self._verdict.finditer(reply) if m.group(1) is not None]
        if not verdicts:
            return NoVerdict(f"no verdict in {_cut(reply)}")
        verdict = verdicts[-1].strip()
        if self._labels is not None:
            value = self._labels.get(verdict.lower())
            return NoVerdict(f"verdict {_cut(verdict)} not a label") if value is None else value
        try:
            return float(verdict)
        except ValueError:
            return NoVerdict(f"verdict {_cut(verdict)} not a number")

    # ------------------------------------------------------------------ the endpoint
    def _probe(self) -> None:
        """ValueError in one line unless the endpoint lists ``model`` within ``timeout_s``: one GET of the
        OpenAI API's model list, by the standard library (the ``openai`` client takes a second to import,
        which only the scoring needs)."""
        c, url = self.config, self.config.base_url.rstrip("/")
        key = f"{self.where}.base_url={c.base_url!r}"
        request = urllib.request.Request(f"{url}/models", headers={"Authorization": f"Bearer {self._api_key}"})
        timed_out = (f"{key}: GET {url}/models timed out after {c.timeout_s:g} s: check that the server runs, or "
                     f"raise {self.where}.timeout_s")
        try:  # one try: a server that is not up fails the start now rather than the first batch later
            with urllib.request.urlopen(request, timeout=c.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                hint = f"set {c.api_key_env} to the endpoint's key"
            elif e.code == 404:
                hint = "base_url must be the API's root, e.g. http://host:8000/v1"
            else:
                hint = "check the server's log"
            raise ValueError(f"{key}: GET {url}/models answered HTTP {e.code}: {hint}") from None
        except TimeoutError:
            raise ValueError(timed_out) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # HTTPException: not HTTP
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                raise ValueError(timed_out) from None
            raise ValueError(f"{key}: nothing answers at {url} ({first_line(reason)}): start the server "
                             f"(e.g. vllm serve {c.model}) or fix the URL") from None
        try:
            served = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, LookupError, TypeError):
            raise ValueError(f"{key}: GET {url}/models answered {_cut(body.decode(errors='replace'))}, not the "
                             f"OpenAI API's list of models: base_url must be the API's root, e.g. "
                             f"http://host:8000/v1") from None
        if c.model not in served:
            raise ValueError(f"{self.where}.model={c.model!r} is not served at {key}: it serves "
                             f"{', '.join(served) or 'no model'}; set {self.where}.model to one of them")

    def _async_client(self) -> openai.AsyncOpenAI:
        """The client of the running event loop: its connections belong to the loop that opened them."""
        import openai

        loop = asyncio.get_running_loop()
        if self._client_loop is not loop:
            c = self.config
            self._client = openai.AsyncOpenAI(base_url=c.base_url, api_key=self._api_key, timeout=c.timeout_s,
                                              max_retries=c.max_retries)
            self._client_loop = loop
        return self._client

    async def _request(self, messages: list[dict[str, str]]) -> str:
        """The endpoint's reply to ``messages``; RuntimeError in one line if it fails after the retries."""
        import openai

        c, url = self.config, self.config.base_url.rstrip("/")
        tries = f"{c.max_retries} retries"
        try:
            response = await self._async_client().chat.completions.create(
                model=c.model, messages=messages, max_tokens=c.max_tokens, temperature=c.temperature)
        except openai.APITimeoutError as e:
            raise RuntimeError(f"judge at {url} did not answer within {c.timeout_s:g} s ({tries})") from e
        except openai.APIConnectionError as e:
            raise RuntimeError(f"judge at {url} cannot be reached ({first_line(e.__cause__ or e)}; {tries})") from e
        except openai.APIStatusError as e:
            raise RuntimeError(f"judge at {url} answered HTTP {e.status_code} ({tries})") from e
        return response.choices[0].message.content or ""

    # ------------------------------------------------------------------ the local model
    def _generate(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        """The local model's replies, generated together (left-padded, one ``generate`` call)."""
        import torch

        model, tokenizer = self._loaded()
        c = self.config
        texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in conversations]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        sampled = c.temperature > 0
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=c.max_tokens, do_sample=sampled,
                                    temperature=c.temperature if sampled else None,
                                    pad_token_id=tokenizer.pad_token_id)
        return tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    def _loaded(self) -> tuple[Any, Any]:
        """The local model and its tokenizer, loaded by the first call."""
        from lit_ppo.models import load_causal_lm, use_chat_template

        with self._load_lock:
            if self._local is None:
                try:
                    model, tokenizer = load_causal_lm(self.config.model)
                except Exception as e:
                    raise RuntimeError(f"{self.where}.model={self.config.model!r} cannot be loaded: "
                                       f"{describe(e.__cause__ or e)}") from e
                tokenizer = use_chat_template(tokenizer)
                tokenizer.padding_side = "left"  # generation continues every row from its last token
                device = model_device(f"{self.where}.device", self.config.device)
                self._local = model.requires_grad_(False).eval().to(device), tokenizer
            return self._local


def _placeholders(template: str) -> list[str]:
    """The field names of the ``str.format`` template; ValueError for malformed braces."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def _check(c: JudgeConfig, where: str) -> None:
    """ValueError in one line naming the key of a setting out of its range (their types are checked)."""
    if not c.model:
        fail(f"{where}.model", c.model, "a model name or a local causal LM directory")
    if c.base_url is not None and not c.base_url.startswith(("http://", "https://")):
        fail(f"{where}.base_url", c.base_url, "an http(s) URL of an OpenAI-compatible API, e.g. http://host:8000/v1, "
                                              "or null for a local model")
    if not c.api_key_env:
        fail(f"{where}.api_key_env", c.api_key_env, "the name of an environment variable")
    braces = "write literal braces as {{ and }}"
    allowed = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
    try:
        names = _placeholders(c.template)
        unknown = [name for name in names if name not in PLACEHOLDERS]
        if not unknown:  # conversions and format specs: what only formatting checks
            c.template.format(**dict.fromkeys(PLACEHOLDERS, ""))
    except (ValueError, LookupError) as e:
        raise ValueError(f"{where}.template is not a str.format template ({e}): {braces}") from None
    if unknown:
        raise ValueError(f"{where}.template has the placeholder {{{unknown[0]}}}: allowed: {allowed}; {braces}")
    if "completion" not in names:
        raise ValueError(f"{where}.template has no {{completion}}: the judge must see the completion; "
                         f"placeholders: {allowed}")
    try:
        groups = re.compile(c.verdict, re.IGNORECASE).groups
    except re.error as e:
        raise ValueError(f"{where}.verdict={c.verdict!r} is invalid: not a regular expression ({e})") from None
    if groups < 1:
        fail(f"{where}.verdict", c.verdict, r"a regular expression with a group capturing the verdict, e.g. "
                                            r"VERDICT:\s*(correct|incorrect)")
    if c.labels is not None and (not c.labels or not all(k.strip() and math.isfinite(v)
                                                         for k, v in c.labels.items())):
        fail(f"{where}.labels", c.labels, "a non-empty mapping of verdicts to finite numbers, or null (the verdict "
                                          "is then a number)")
    check_positive_int(f"{where}.max_tokens", c.max_tokens)
    check_number(f"{where}.temperature", c.temperature, low=0)
    check_number(f"{where}.timeout_s", c.timeout_s, low=0, low_open=True)
    check_number(f"{where}.max_retries", c.max_retries, low=0)
    check_device(f"{where}.device", c.device)

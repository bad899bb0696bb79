"""An OpenAI-compatible chat client backed by a rollout engine, for agents written against the ``openai``
SDK: ``client.chat.completions.create(messages=..., tools=...)`` returns the SDK's own ``ChatCompletion``
(``message.content``, ``message.tool_calls``, ``finish_reason``, ``usage``), sampled by the engine that
the trainer pushes its weights into, and every call is recorded on token ids for training.

Prompts go through the model's chat template with the tools; where the template has no place for
tools, tool calls or the ``tool`` role, the tool-call format writes them as text
(``lit_ppo.rollout.episodes.tool_calls``). Sampling is the rollout's: a request's ``temperature`` / ``top_p``
must be the rollout's (the trainer recomputes log-probs under that distribution), and a parameter the
engine cannot honour, or one of the wrong type or shape, is refused in one line (``InvalidRequest``, a
ValueError naming the parameter at fault as the OpenAI API does: ``messages[1].tool_calls[0].id``), never
ignored nor guessed at.

Token-in, token-out: a call whose messages extend an earlier call's messages and the reply it got
continues that call's token sequence. The earlier tokens stay exactly as sampled; only the new
messages' tokens (rendered by the template after the reply) are appended, and the engine samples from
that very sequence (``lit_ppo.rollout.episodes.conversation``). Where the template renders the earlier
turns differently once more messages follow (a reasoning model dropping past thinking), or where the
agent trimmed or rewrote the history (its request carries an assistant turn and opens as an earlier
conversation did, but extends none), the call starts a sequence of its own and ``drifted_calls`` counts
it. A new conversation, or the same question asked afresh, is a sequence of its own too, not a drift.
``episodes()`` gives one ``Episode`` per sequence that no later call extended: the samples of the
agent's run.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import TemplateError
from openai.types.chat import ChatCompletion
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall, Function
from openai.types.completion_usage import CompletionUsage

from lit_ppo.rollout.engines.protocol import Completion, RolloutEngine, SamplingParams
from lit_ppo.rollout.engines.shared import SharedGenerate
from lit_ppo.rollout.episodes import conversation
from lit_ppo.rollout.episodes.episode import Episode
from lit_ppo.rollout.episodes.tool_calls import detect_format, parse_reply, render_calls, render_result, render_tools

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The message roles a request may hold (``developer`` is rendered as ``system``)."""
HONOURED = {"messages", "model", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
            "max_completion_tokens", "stop", "n", "seed"}
"""The parameters of ``create`` that the engine honours; any other one given is refused."""


class InvalidRequest(ValueError):
    """A request ``create`` refuses, in one line. Args: ``message`` (after the ``chat.completions.create:``
    prefix it gets); ``param``: the parameter at fault, in the OpenAI API's notation
    (``messages[0].content``), None for the request as a whole; ``code``: the API's error code for it."""

    def __init__(self, message: str, param: str | None, code: str):
        super().__init__(f"chat.completions.create: {message}")
        self.param = param
        self.code = code


@dataclass
class _Sequence:
    """One token sequence of the agent's run: the messages it renders and the reply it ended with."""

    messages: list[dict]
    """The request's messages (normalised) of its latest call."""
    reply: dict
    """The assistant message that call returned (normalised)."""
    token_ids: list[int]
    """Every token so far, the latest completion included."""
    episode: Episode
    """Its segments: context and generated tokens in order."""
    last_completion: list[int] = field(default_factory=list)
    """The tokens of the latest completion."""


class EngineChatClient:
    """``client.chat.completions.create(...)`` on ``engine``, in the shapes of the ``openai`` SDK.

    Args:
        engine: the rollout engine that samples (its ``version`` tags each completion), or its
            ``SharedGenerate`` where several clients share it.
        tokenizer: the policy's tokenizer, with a chat template.
        params: the rollout's sampling parameters: temperature, top-k / top-p, stop tokens, the default
            ``max_new_tokens`` and the base seed of the calls (``params.n`` is not used: ``n`` is each call's).
        max_model_len: the most tokens a sequence may hold (prompt and completion).
        tool_format: ``hermes``, ``json`` or ``auto`` (``lit_ppo.rollout.episodes.tool_calls.detect_format``),
            as ``RolloutConfig.tool_format`` checked it.
        model: the name the completions report.
    """

    def __init__(self, engine: RolloutEngine | SharedGenerate, tokenizer, params: SamplingParams, max_model_len: int,
                 tool_format: str = "auto", model: str = "lit_ppo-policy"):
        self.engine = engine
        self.tokenizer = tokenizer
        self.params = params
        self.max_model_len = max_model_len
        self.model = model
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
        self.tool_format = detect_format(template) if tool_format == "auto" else tool_format
        self._takes_tools = template is not None and "tools" in template
        self._renders_tool_calls = template is not None and "tool_calls" in template
        self._knows_tool_role = self._renders([{"role": "user", "content": "x"},
                                               {"role": "tool", "content": "y", "tool_call_id": "call_0"}])
        self._assistant_close = self._template_close()
        self.sequences: list[_Sequence] = []
        self.drifted_calls = 0
        """Calls that drifted from an earlier call's sequence (see the module docstring)."""
        self.turns: list[list[Episode]] = []
        """Each call that returned, as samples of their own: one per choice, its prompt as context and its
        completion generated (an agent that rewards each call trains on these, ``AgentWorkflow``)."""
        self.drifted_from: list[_Sequence] = []
        """The sequences those calls drifted from (each call started a sequence of its own instead)."""
        self.base_url: str | None = None
        """Where the same episode is served over HTTP (``lit_ppo.rollout.episodes.chat_endpoint``), for an agent
        that talks to it with ``openai.OpenAI(base_url=client.base_url, api_key=client.api_key)``; None if
        nowhere."""
        self.api_key: str | None = None
        """The episode's key at ``base_url``."""
        self._calls = itertools.count()
        self._lock = threading.Lock()  # one call of this client at a time (engines that several clients
        # share take their calls through lit_ppo.rollout.engines.shared)
        self.closed = False
        """The episode has ended: calls are refused and nothing more is recorded."""
        self.chat = _Chat(self)

    def close(self) -> None:
        """End the episode: later calls are refused, and a call still sampling records nothing."""
        self.closed = True

    # ------------------------------------------------------------------ the request
    def create(self, **request: Any) -> ChatCompletion:
        """``chat.completions.create``: see the class and the module docstrings."""
        if self.closed:
            raise InvalidRequest("the episode has ended (its agent returned or ran past its timeout): a call after "
                                 "that trains nothing", None, "episode_ended")
        unknown = sorted(k for k, v in request.items() if k not in HONOURED and not _not_given(v))
        if unknown:
            raise InvalidRequest(f"{unknown[0]} cannot be honoured by the rollout engine; it takes "
                                 f"{', '.join(sorted(HONOURED))}", unknown[0], "unsupported_parameter")
        messages = [_normalised(m, i) for i, m in enumerate(_array(request, "messages", "message objects"))]
        if not messages:
            raise InvalidRequest("messages is empty: give at least one message", "messages", "invalid_value")
        tools = _array(request, "tools", "function tools")
        names = _tool_names(tools)
        choice = _given(request, "tool_choice")
        if choice == "none":
            names = set()
        elif choice not in (None, "auto"):
            raise InvalidRequest(f"tool_choice={choice!r} cannot be honoured: sampling is not constrained to a call; "
                                 f"give tool_choice='auto' or 'none'", "tool_choice", "unsupported_value")
        params = self._sampling(request)
        call = next(self._calls)
        if params.seed is None and self.params.seed is not None:  # reproducible, a different seed per call
            params = replace(params, seed=self.params.seed + call)
        extended = self._extended(messages)
        try:
            text = self._render(messages, tools, add_generation_prompt=True)
        except TemplateError as e:  # a template's raise_exception: an order of roles it does not take
            raise InvalidRequest(f"the model's chat template refuses these messages: {e}", "messages",
                                 "invalid_value") from None
        prompt_ids = None if extended is None else self._continued(extended, text, tools)
        drifted = (extended if prompt_ids is None else None) if extended is not None else self._rewritten(messages)
        if prompt_ids is None:
            prompt_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(prompt_ids) + params.max_new_tokens > self.max_model_len:
            raise InvalidRequest(f"the conversation holds {len(prompt_ids)} tokens and max_tokens="
                                 f"{params.max_new_tokens}, more than the model's {self.max_model_len}: shorten the "
                                 f"messages or lower max_tokens", "messages", "context_length_exceeded")
        if drifted is not None:
            self.drifted_calls += 1
            self.drifted_from.append(drifted)
        with self._lock:
            (completions,) = self.engine.generate([prompt_ids], params)
            choices, turn = [], []
            for index, completion in enumerate(completions):
                message, reason = self._message(completion, names, call, index)
                if not self.closed:
                    self._record(extended, messages, prompt_ids, completion, message)
                    turn.append(Episode(prompt=_first_user(messages)))
                    turn[-1].add_context(prompt_ids)
                    turn[-1].add_generation(completion)
                choices.append(Choice(index=index, message=message, finish_reason=reason))
            if turn:
                self.turns.append(turn)
        generated = sum(len(c.token_ids) for c in completions)
        return ChatCompletion(id=f"chatcmpl-{call}", object="chat.completion", created=int(time.time()),
                              model=self.model, choices=choices,
                              usage=CompletionUsage(prompt_tokens=len(prompt_ids), completion_tokens=generated,
                                                    total_tokens=len(prompt_ids) + generated))

    def _sampling(self, request: dict) -> SamplingParams:
        """The rollout's sampling parameters with what the request may set (n, max tokens, stop, seed)."""
        params = self.params
        for key, ours in (("temperature", params.temperature), ("top_p", params.top_p)):
            value = _given(request, key)
            if value is not None and (not _is_number(value) or float(value) != float(ours)):
                raise InvalidRequest(f"{key}={value!r} cannot be honoured: the rollout samples at {key}={ours}, under "
                                     f"which the trainer recomputes the log-probs; leave it out or give {ours}", key,
                                     "unsupported_value" if _is_number(value) else "invalid_type")
        for key in ("n", "max_tokens", "max_completion_tokens", "seed"):
            value = _given(request, key)
            least = 0 if key == "seed" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                kind = "a non-negative integer" if key == "seed" else "a positive integer"
                raise InvalidRequest(f"{key}={value!r} is invalid: must be {kind}", key,
                                     "invalid_value" if isinstance(value, int) else "invalid_type")
        stop_ids = list(params.stop_token_ids)
        stop = _given(request, "stop")
        words = [stop] if isinstance(stop, str) else stop or []
        if not isinstance(words, (list, tuple)) or not all(isinstance(word, str) for word in words):
            raise InvalidRequest(f"stop={stop!r} is invalid: must be a string or an array of strings", "stop",
                                 "invalid_type")
        for word in words:
            ids = self.tokenizer.encode(word, add_special_tokens=False)
            if len(ids) != 1:
                raise InvalidRequest(f"stop={word!r} cannot be honoured: the engine stops on single tokens and it is "
                                     f"{len(ids)}", "stop", "unsupported_value")
            stop_ids.append(ids[0])
        max_tokens = _given(request, "max_completion_tokens", _given(request, "max_tokens"))
        return replace(params, n=_given(request, "n") or 1, max_new_tokens=max_tokens or params.max_new_tokens,
                       stop_token_ids=stop_ids, seed=_given(request, "seed"))

    def _message(self, completion: Completion, names: set[str], call: int,
                 index: int) -> tuple[ChatCompletionMessage, str]:
        """The assistant message of a completion and its finish reason."""
        text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        if not completion.stopped:
            return ChatCompletionMessage(role="assistant", content=text), "length"
        reply = parse_reply(text, self.tool_format, names)
        if not reply.calls:
            return ChatCompletionMessage(role="assistant", content=reply.content or ""), "stop"
        calls = [ChatCompletionMessageFunctionToolCall(id=f"call_{call}_{index}_{i}", type="function",
                                                       function=Function(name=name, arguments=arguments))
                 for i, (name, arguments) in enumerate(reply.calls)]
        return ChatCompletionMessage(role="assistant", content=reply.content, tool_calls=calls), "tool_calls"

    # ------------------------------------------------------------------ token-in, token-out
    def _extended(self, messages: list[dict]) -> _Sequence | None:
        """The latest sequence whose messages and reply begin ``messages`` (with more after them)."""
        for sequence in reversed(self.sequences):
            prefix = [*sequence.messages, sequence.reply]
            if len(messages) > len(prefix) and messages[:len(prefix)] == prefix:
                return sequence
        return None

    def _rewritten(self, messages: list[dict]) -> _Sequence | None:
        """The latest sequence whose conversation ``messages`` rewrites: a request that extends none, carries an
        earlier assistant turn, and opens with the same first user message (a trimmed or edited history)."""
        if not any(m["role"] == "assistant" for m in messages):
            return None  # a conversation of its own, or the same question asked afresh
        first = _first_user(messages)
        return next((s for s in reversed(self.sequences) if _first_user(s.messages) == first), None)

    def _continued(self, sequence: _Sequence, after: str, tools: list[dict]) -> list[int] | None:
        """The tokens of the request rendered as ``after`` as the continuation of ``sequence``: its tokens as
        sampled, then the rest of the reply's closing and the new messages as the template renders them
        after it; None where the template renders the earlier conversation differently once they follow."""
        before = self._render([*sequence.messages, sequence.reply], tools, add_generation_prompt=False)
        new = conversation.appended(before, after)
        if new is None:
            return None
        continued = conversation.continuation_ids(self.tokenizer, self._assistant_close, sequence.last_completion, new)
        return [*sequence.token_ids, *continued]

    def _record(self, extended: _Sequence | None, messages: list[dict], prompt_ids: list[int],
                completion: Completion, message: ChatCompletionMessage) -> None:
        """Add the call's completion to the sequence it continued (a copy of it for each further choice), or
        start a sequence."""
        reply = _normalised(message, len(messages))
        continues = extended is not None and prompt_ids[:len(extended.token_ids)] == extended.token_ids
        if continues and extended in self.sequences:
            self.sequences.remove(extended)  # the sequence goes on in its continuation
        episode = Episode(prompt=_first_user(messages))
        if continues:
            episode.segments = list(extended.episode.segments)
            episode.add_context(prompt_ids[len(extended.token_ids):])
        else:
            episode.add_context(prompt_ids)
        episode.add_generation(completion)
        self.sequences.append(_Sequence(messages, reply, [*prompt_ids, *completion.token_ids], episode,
                                        list(completion.token_ids)))

    def episodes(self, drifted: bool = True) -> list[Episode]:
        """One episode per sequence of the run (the samples), in the order their latest calls ended;
        ``drifted=False`` leaves out the sequences that a drifted call extended."""
        return [sequence.episode for sequence in self.sequences
                if drifted or not any(sequence is old for old in self.drifted_from)]

    # ------------------------------------------------------------------ the chat template
    def _render(self, messages: list[dict], tools: list[dict], add_generation_prompt: bool) -> str:
        """The conversation's text under the chat template, tools and tool turns written as the template
        takes them (or as text in the tool-call format where it does not)."""
        messages = [self._templated(m) for m in messages]
        kwargs = {}
        if tools and self._takes_tools:
            kwargs["tools"] = tools
        elif tools:
            announced = render_tools(tools, self.tool_format)
            if messages[0]["role"] == "system":
                messages[0] = {**messages[0], "content": announced + "\n\n" + messages[0]["content"]}
            else:
                messages.insert(0, {"role": "system", "content": announced})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **kwargs)

    def _templated(self, message: dict) -> dict:
        """``message`` as the chat template takes it."""
        role = "system" if message["role"] == "developer" else message["role"]
        if role == "assistant" and message.get("tool_calls") and not self._renders_tool_calls:
            calls = render_calls([(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]],
                                 self.tool_format)
            return {"role": role, "content": f"{message['content']}\n{calls}" if message["content"] else calls}
        if role == "tool" and not self._knows_tool_role:
            return {"role": "user", "content": render_result(message["content"], self.tool_format)}
        return {**message, "role": role}

    def _renders(self, messages: list[dict]) -> bool:
        """Whether the chat template renders ``messages`` (a template may raise on a role it does not know)."""
        try:
            self.tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception:
            return False
        return True

    def _template_close(self) -> str:
        """What the template writes after an assistant message's content (up to the next message)."""
        exchange = [{"role": "user", "content": conversation.SENTINEL_USER},
                    {"role": "assistant", "content": conversation.SENTINEL_ASSISTANT}]
        close = conversation.assistant_close(self.tokenizer.apply_chat_template(exchange, tokenize=False))
        if close is None:
            raise ValueError("the tokenizer's chat template does not render an assistant message's content verbatim, "
                             "which token-in, token-out conversations need")
        return close


class AsyncEngineChatClient:
    """``await client.chat.completions.create(...)``: ``EngineChatClient``'s calls for ``asyncio`` agents
    (the ``openai.AsyncOpenAI`` shape), each run in a worker thread. Takes the arguments of
    ``EngineChatClient`` (or one as ``client``) and reads as it (``episodes()``, ``drifted_calls``)."""

    def __init__(self, *args: Any, client: EngineChatClient | None = None, **kwargs: Any):
        self.client = client if client is not None else EngineChatClient(*args, **kwargs)
        self.chat = _Chat(self)

    async def create(self, **request: Any) -> ChatCompletion:
        return await asyncio.to_thread(self.client.create, **request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class _Chat:
    """``client.chat``: holds ``completions``."""

    def __init__(self, client):
        self.completions = _Completions(client)


class _Completions:
    """``client.chat.completions``: ``create`` as the client's."""

    def __init__(self, client):
        self.create = client.create


def _not_given(value: Any) -> bool:
    """Whether ``value`` says "not given": None, or the ``openai`` SDK's ``NOT_GIVEN`` / ``omit``."""
    return value is None or type(value).__name__ in ("NotGiven", "Omit")


def _given(request: dict, key: str, default: Any = None) -> Any:
    value = request.get(key)
    return default if _not_given(value) else value


def _array(request: dict, key: str, what: str) -> list:
    """The request's array ``key`` (``[]`` if not given); InvalidRequest if it is not one."""
    value = _given(request, key, [])
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"{key} is {_json_type(value)}: must be an array of {what}", key, "invalid_type")
    return list(value)


def _json_type(value: Any) -> str:
    """What ``value`` is, in JSON's words (an object of the SDK or Python: its class)."""
    for kind, name in ((bool, "a boolean"), (str, "a string"), (int, "an integer"), (float, "a number"),
                       (dict, "an object"), ((list, tuple), "an array")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else f"a {type(value).__name__}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _string(container: dict, key: str, param: str, default: str | None = None) -> str:
    """``container[key]``, which must be a string (``default`` where it is not given and there is one);
    InvalidRequest naming ``param`` otherwise."""
    value = container.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        raise InvalidRequest(f"{param} is missing: it is required", param, "missing_required_parameter")
    if not isinstance(value, str):
        raise InvalidRequest(f"{param} is {_json_type(value)}: must be a string", param, "invalid_type")
    return value


def _tool_names(tools: list) -> set[str]:
    """The functions ``tools`` offers (OpenAI ``{"type": "function", "function": {"name": ...}}`` entries)."""
    names = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function" or \
                not isinstance(function.get("name"), str):
            raise InvalidRequest(f"tools[{i}] is invalid: must be {{'type': 'function', 'function': {{'name': ..., "
                                 f"'parameters': {{...}}}}}}", f"tools[{i}]", "invalid_value")
        names.add(function["name"])
    return names


def _normalised(message: Any, index: int) -> dict:
    """A request's message (a dict or an SDK object) as a plain dict of what the template and the
    continuation compare: role, content (text), tool calls, the id of the call a tool result answers.
    InvalidRequest for a message of the wrong shape, naming the field."""
    at = f"messages[{index}]"
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, dict):
        raise InvalidRequest(f"{at} is {_json_type(message)}: must be an object with a role and a content", at,
                             "invalid_type")
    if message.get("role") not in ROLES:
        raise InvalidRequest(f"{at} has role {message.get('role')!r}: must be one of {', '.join(ROLES)}",
                             f"{at}.role", "invalid_value")
    out = {"role": message["role"], "content": _content(message.get("content"), f"{at}.content")}
    calls = message.get("tool_calls") or []
    if not isinstance(calls, (list, tuple)):
        raise InvalidRequest(f"{at}.tool_calls is {_json_type(calls)}: must be an array of tool calls",
                             f"{at}.tool_calls", "invalid_type")
    if calls:
        out["tool_calls"] = [_tool_call(call, f"{at}.tool_calls[{i}]") for i, call in enumerate(calls)]
    if message["role"] == "tool":
        out["tool_call_id"] = _string(message, "tool_call_id", f"{at}.tool_call_id", default="")
    return out


def _content(content: Any, param: str) -> str:
    """A message's content as text: a string, or an array of text parts (None: empty)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, (list, tuple)):
        raise InvalidRequest(f"{param} is {_json_type(content)}: must be a string or an array of text parts",
                             param, "invalid_type")
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise InvalidRequest(f"{param} holds a part that is not text: only text parts can be honoured",
                                 f"{param}[{i}]", "invalid_value")
        _string(part, "text", f"{param}[{i}].text")
    return "".join(part["text"] for part in content)


def _tool_call(call: Any, param: str) -> dict:
    """An assistant message's tool call: an id, and a function with a name and its arguments (a JSON text)."""
    if not isinstance(call, dict) or call.get("type", "function") != "function" or \
            not isinstance(call.get("function"), dict):
        raise InvalidRequest(f"{param} is invalid: must be {{'id': ..., 'type': 'function', 'function': {{'name': "
                             f"..., 'arguments': '<JSON>'}}}}", param, "invalid_value")
    function = call["function"]
    return {"id": _string(call, "id", f"{param}.id"), "type": "function",
            "function": {"name": _string(function, "name", f"{param}.function.name"),
                         "arguments": _string(function, "arguments", f"{param}.function.arguments")}}


def _first_user(messages: list[dict]) -> str:
    """The first user message's text (an episode's prompt in logs)."""
    return next((m["content"] for m in messages if m["role"] == "user"), "")

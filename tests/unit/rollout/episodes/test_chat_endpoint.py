"""The local OpenAI-protocol endpoint (lit_ppo.rollout.episodes.chat_endpoint), driven by the real ``openai`` client
over HTTP: answers and tool calls in the SDK's types, episodes told apart by their key, refusals in the
API's error shape, the port freed on close."""

from __future__ import annotations

import socket

import openai
import pytest

from lit_ppo.rollout.episodes.chat_endpoint import ChatEndpoint
from tests.unit.rollout.episodes.test_chat_client import CALC, TOOLS_CHATML, client_of


@pytest.fixture
def endpoint():
    with ChatEndpoint(model="policy") as served:
        yield served


def agent(endpoint: ChatEndpoint, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint.url, api_key=key, max_retries=0, timeout=30)


def test_the_openai_client_calls_a_tool_and_continues_over_http(endpoint):
    call = '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>'
    client, engine, tok = client_of(TOOLS_CHATML, call, "84")
    key = endpoint.open(client)
    sdk = agent(endpoint, key)
    assert [m.id for m in sdk.models.list()] == ["policy"]
    messages = [{"role": "user", "content": "12*7?"}]
    first = sdk.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    (tool_call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and tool_call.function.name == "calc"
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": tool_call.id, "content": "84"}]
    second = sdk.chat.completions.create(model="policy", messages=messages, tools=[CALC])
    assert second.choices[0].message.content == "84" and second.usage.completion_tokens == 3
    (episode,) = client.episodes()  # the SDK's round trip kept one token sequence
    assert [s.generated for s in episode.segments] == [False, True, False, True]


def test_episodes_are_told_apart_and_an_ended_or_unknown_one_is_refused(endpoint):
    first, _, _ = client_of(TOOLS_CHATML, "7")
    second, _, _ = client_of(TOOLS_CHATML, "9")
    keys = endpoint.open(first), endpoint.open(second)
    answers = [agent(endpoint, key).chat.completions.create(model="policy", messages=[
        {"role": "user", "content": "?"}]).choices[0].message.content for key in reversed(keys)]
    assert answers == ["9", "7"] and len(first.episodes()) == len(second.episodes()) == 1
    endpoint.close_episode(keys[0])
    for key in (keys[0], "ep-unknown"):
        with pytest.raises(openai.NotFoundError, match="is unknown or has ended"):
            agent(endpoint, key).chat.completions.create(model="policy", messages=[{"role": "user", "content": "?"}])


def test_a_request_the_client_cannot_honour_is_a_400_with_its_reason(endpoint):
    client, engine, _ = client_of(TOOLS_CHATML, "7")
    sdk = agent(endpoint, endpoint.open(client))
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="policy", messages=[{"role": "user", "content": "?"}], temperature=0.2)
    assert refused.value.body["message"].startswith("chat.completions.create: temperature=0.2 cannot be honoured")
    with pytest.raises(openai.BadRequestError, match="stream cannot be honoured"):
        sdk.chat.completions.create(model="policy", messages=[{"role": "user", "content": "?"}], stream=True)
    assert engine.prompts == []


def test_it_listens_on_loopback_only_and_frees_its_port():
    served = ChatEndpoint()
    host, port = served._server.server_address
    assert host == "127.0.0.1"
    served.close()
    with socket.socket() as again:  # the port is free once closed
        again.bind(("127.0.0.1", port))


def test_every_episode_in_flight_may_connect_at_once(endpoint):
    """128 clients connect together while the engine is busy: none is reset (a listen backlog of 5 reset some)."""
    import threading
    import time

    answered, errors = [], []
    gate = threading.Barrier(128)

    def one(i: int) -> None:
        client, engine, _ = client_of(TOOLS_CHATML, str(i))
        slow = engine.generate
        engine.generate = lambda prompts, params: (time.sleep(0.2), slow(prompts, params))[1]
        key = endpoint.open(client)
        gate.wait()
        try:
            reply = agent(endpoint, key).chat.completions.create(model="policy", messages=[
                {"role": "user", "content": "?"}])
            answered.append(reply.choices[0].message.content == str(i))
        except openai.APIError as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(128)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert errors == [] and answered == [True] * 128

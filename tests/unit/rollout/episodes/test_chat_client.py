"""The OpenAI-compatible client on a rollout engine (lit_ppo.rollout.episodes.chat_client): the SDK's shapes, tool
calls in each kind of chat template, token-in / token-out across calls, drift, and every refusal, on a
character-level ChatML tokenizer and a scripted engine (each token and prompt known by hand)."""

from __future__ import annotations

import asyncio
import json
import string

import openai
import pytest
from openai.types.chat import ChatCompletion

from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.episodes.chat_client import AsyncEngineChatClient, EngineChatClient
from tests.unit.fakes import ScriptedEngine

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""SmolLM2's kind: any role, no tools."""
TOOLS_CHATML = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}{{ '\\n<tool_call>\\n{\"name\": \"' + c['function']['name'] + "
    "'\", \"arguments\": ' + c['function']['arguments'] + '}\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""Qwen 2.5's kind: tools in the system turn, calls and results in <tool_call> / <tool_response>."""
STRICT = ("{% for m in messages %}{% if m['role'] not in ('system', 'user', 'assistant') %}"
          "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
          "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""A template that knows three roles (the tiny model's kind)."""
THINKING = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
            "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
            "{% else %}{{ m['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""A reasoning model's kind: past thinking is dropped once the conversation goes on."""
CALC = {"type": "function", "function": {"name": "calc", "description": "evaluate arithmetic",
                                         "parameters": {"type": "object",
                                                        "properties": {"expression": {"type": "string"}}}}}


def chatml_tokenizer(template: str):
    """One token per printable character, and ChatML's two special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<unk>", *string.printable])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(IM_START, special=True), AddedToken(IM_END, special=True)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=IM_END, unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


def said(tokenizer, text: str, stopped: bool = True) -> Completion:
    """The completion that writes ``text`` (and the stop token when ``stopped``), log-prob -0.5 per token."""
    ids = tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if stopped else [])
    return Completion(ids, [-0.5] * len(ids), stopped, version=0)


def client_of(template: str, *replies: str, **kwargs):
    tokenizer = chatml_tokenizer(template)
    engine = ScriptedEngine([[said(tokenizer, reply)] for reply in replies])
    params = SamplingParams(temperature=1.0, max_new_tokens=64, stop_token_ids=[tokenizer.eos_token_id], seed=3)
    return EngineChatClient(engine, tokenizer, params, max_model_len=kwargs.pop("max_model_len", 4096), **kwargs), \
        engine, tokenizer


def test_an_answer_in_the_sdk_shapes_and_its_tokens_recorded():
    client, engine, tok = client_of(CHATML, "7")
    response = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "3+4?"}])
    assert isinstance(response, ChatCompletion)
    (choice,) = response.choices
    assert choice.message.content == "7" and choice.message.tool_calls is None and choice.finish_reason == "stop"
    prompt = tok.encode(f"{IM_START}user\n3+4?{IM_END}\n{IM_START}assistant\n", add_special_tokens=False)
    assert engine.prompts == [[prompt]]
    assert response.usage.prompt_tokens == len(prompt) and response.usage.completion_tokens == 2
    assert engine.params[0].seed == 3 and engine.params[0].temperature == 1.0  # the rollout's, call 0
    (episode,) = client.episodes()
    context, generated = episode.segments
    assert context.token_ids == prompt and not context.generated
    assert tok.decode(generated.token_ids) == f"7{IM_END}" and generated.logprobs == [-0.5, -0.5]
    assert generated.version == 7  # the engine's version when it sampled


def test_a_tool_call_then_its_result_continue_one_token_sequence():
    call = '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>'
    client, engine, tok = client_of(TOOLS_CHATML, call, "84")
    messages = [{"role": "user", "content": "12*7?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    (choice,) = first.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tool_call,) = choice.message.tool_calls
    assert tool_call.function.name == "calc" and json.loads(tool_call.function.arguments) == {"expression": "12*7"}
    messages += [choice.message, {"role": "tool", "tool_call_id": tool_call.id, "content": "84"}]
    second = client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    assert second.choices[0].message.content == "84"
    # The second prompt is the first prompt, the call as sampled, then only the new turn's tokens.
    first_prompt, second_prompt = engine.prompts[0][0], engine.prompts[1][0]
    sampled = said(tok, call).token_ids
    new = tok.encode(f"\n{IM_START}user\n<tool_response>\n84\n</tool_response>{IM_END}\n{IM_START}assistant\n",
                     add_special_tokens=False)
    assert second_prompt == first_prompt + sampled + new
    assert tok.decode(first_prompt).startswith(f"{IM_START}system\n# Tools\n{json.dumps(CALC)}")
    (episode,) = client.episodes()
    assert [s.generated for s in episode.segments] == [False, True, False, True]
    assert episode.segments[2].token_ids == new and client.drifted_calls == 0


def test_a_template_without_tools_gets_them_as_text_and_renders_the_tool_role():
    call = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call>'
    client, engine, tok = client_of(CHATML, call, "4", tool_format="hermes")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    prompt = tok.decode(engine.prompts[0][0])
    assert prompt.startswith(f"{IM_START}system\n# Tools\n") and json.dumps(CALC) in prompt
    assert prompt.endswith(f"Be brief.{IM_END}\n{IM_START}user\n2+2?{IM_END}\n{IM_START}assistant\n")
    message = first.choices[0].message
    messages += [message.model_dump(exclude_none=True),  # as a dict: the same message
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "4"}]
    client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    assert tok.decode(engine.prompts[1][0]).endswith(f"{IM_END}\n{IM_START}tool\n4{IM_END}\n{IM_START}assistant\n")
    assert len(client.episodes()) == 1


def test_a_template_that_knows_no_tool_role_gets_the_result_as_a_user_turn():
    call = '{"name": "calc", "arguments": {"expression": "5-1"}}'
    client, engine, tok = client_of(STRICT, call, "4")  # no <tool_call> in the template: the json format
    assert client.tool_format == "json"
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "5-1?"}], tools=[CALC])
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "calc"
    messages = [{"role": "user", "content": "5-1?"}, message,
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "4"}]
    client.chat.completions.create(model="m", messages=messages, tools=[CALC])
    assert tok.decode(engine.prompts[1][0]).endswith(
        f"{call}{IM_END}\n{IM_START}user\nTool result: 4{IM_END}\n{IM_START}assistant\n")
    assert len(client.episodes()) == 1


def test_a_template_that_renders_earlier_turns_differently_starts_a_sample_and_counts_the_drift():
    client, engine, tok = client_of(THINKING, "<think>hm</think>7", "8")
    messages = [{"role": "user", "content": "3+4?"}]
    first = client.chat.completions.create(model="m", messages=messages)
    messages += [first.choices[0].message, {"role": "user", "content": "and 4+4?"}]
    client.chat.completions.create(model="m", messages=messages)
    assert client.drifted_calls == 1
    # The second call is its own sample, prompted as the template renders it (the thinking dropped).
    assert tok.decode(engine.prompts[1][0]) == (f"{IM_START}user\n3+4?{IM_END}\n{IM_START}assistant\n7{IM_END}\n"
                                                f"{IM_START}user\nand 4+4?{IM_END}\n{IM_START}assistant\n")
    assert [len(e.segments) for e in client.episodes()] == [2, 2]


def test_a_new_conversation_and_a_rewritten_history_are_samples_of_their_own_and_only_the_rewrite_drifts():
    client, engine, tok = client_of(CHATML, "7", "9", "7", "5")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "3+4?"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "4+5?"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "3+4?"}])  # asked afresh
    assert len(client.episodes()) == 3 and client.drifted_calls == 0
    rewritten = [{"role": "user", "content": "3+4?"}, {"role": "assistant", "content": "seven"},
                 {"role": "user", "content": "2+3?"}]
    client.chat.completions.create(model="m", messages=rewritten)
    assert len(client.episodes()) == 4 and client.drifted_calls == 1
    # The rewrite drifted from the latest sequence that opened with "3+4?"; data.on_drift=last leaves it out.
    assert client.drifted_from == [client.sequences[2]]
    assert len(client.episodes(drifted=False)) == 3


def test_a_malformed_call_is_content_and_a_cut_off_reply_has_length():
    client, engine, tok = client_of(TOOLS_CHATML, '<tool_call>{"name": "calc", "arguments": {</tool_call>')
    response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}], tools=[CALC])
    assert response.choices[0].finish_reason == "stop" and response.choices[0].message.tool_calls is None
    assert response.choices[0].message.content == '<tool_call>{"name": "calc", "arguments": {</tool_call>'
    tokenizer = chatml_tokenizer(CHATML)
    engine = ScriptedEngine([[said(tokenizer, "1234", stopped=False)]])
    client = EngineChatClient(engine, tokenizer, SamplingParams(max_new_tokens=4), max_model_len=4096)
    response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}], max_tokens=4)
    assert response.choices[0].finish_reason == "length" and response.choices[0].message.content == "1234"
    assert engine.params[0].max_new_tokens == 4


def test_what_the_sdk_leaves_out_is_no_parameter():
    client, engine, tok = client_of(CHATML, "7")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}],
                                   frequency_penalty=openai.NOT_GIVEN, logit_bias=None, temperature=1.0, seed=11,
                                   stop=["\n"], n=1)
    assert engine.params[0].seed == 11 and engine.params[0].stop_token_ids == [tok.eos_token_id,
                                                                              tok.convert_tokens_to_ids("\n")]


@pytest.mark.parametrize("request_,expected", [
    ({"temperature": 0.7}, "temperature=0.7 cannot be honoured: the rollout samples at temperature=1.0"),
    ({"top_p": 0.9}, "top_p=0.9 cannot be honoured: the rollout samples at top_p=1.0"),
    ({"frequency_penalty": 0.5}, "frequency_penalty cannot be honoured by the rollout engine; it takes "),
    ({"stream": True}, "stream cannot be honoured by the rollout engine"),
    ({"tools": [CALC], "tool_choice": "required"}, "tool_choice='required' cannot be honoured: sampling is not "),
    ({"tools": [{"type": "function"}]}, "tools[0] is invalid: must be {'type': 'function', "),
    ({"stop": ["END"]}, "stop='END' cannot be honoured: the engine stops on single tokens and it is 3"),
    ({"n": 0}, "n=0 is invalid: must be a positive integer"),
    ({"max_tokens": 5000}, "the conversation holds 23 tokens and max_tokens=5000, more than the model's 4096: "),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "messages[0] has role 'narrator': must be one of "),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content holds a part that is not text"),
    ({"messages": []}, "messages is empty"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(request_, expected):
    client, engine, tok = client_of(CHATML, "7")
    request = {"model": "m", "messages": [{"role": "user", "content": "3+4?"}], **request_}
    with pytest.raises(ValueError) as refused:
        client.chat.completions.create(**request)
    message = str(refused.value)
    assert message.startswith("chat.completions.create: " + expected) and "\n" not in message
    assert engine.prompts == []  # nothing was sampled


def test_the_async_client_serves_concurrent_conversations():
    client, engine, tok = client_of(CHATML, "7", "9")
    agent = AsyncEngineChatClient(client=client)

    async def both():
        return await asyncio.gather(*(agent.chat.completions.create(model="m", messages=[
            {"role": "user", "content": question}]) for question in ("3+4?", "4+5?")))

    answers = asyncio.run(both())
    assert sorted(a.choices[0].message.content for a in answers) == ["7", "9"]
    assert len(agent.episodes()) == 2 and agent.drifted_calls == 0

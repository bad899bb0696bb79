"""Unit tests for ``lit_ppo.rollout.episodes.conversation``: the template's text after an assistant turn, read
off sentinel renders, and the tokens appended after the sampled ones."""

from __future__ import annotations

from lit_ppo.rollout.episodes import conversation
from tests.unit.rollout.episodes.test_chat_client import CHATML, IM_END, IM_START, chatml_tokenizer

TOK = chatml_tokenizer(CHATML)
USER, ASSISTANT = conversation.SENTINEL_USER, conversation.SENTINEL_ASSISTANT
EXCHANGE = [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_the_assistant_close_is_read_off_a_render_of_sentinels():
    assert conversation.assistant_close(TOK.apply_chat_template(EXCHANGE, tokenize=False)) == f"{IM_END}\n"
    assert conversation.assistant_close(f"{USER}\n") is None  # the template dropped the assistant's content
    assert conversation.assistant_close(f"{ASSISTANT}|{ASSISTANT}|") is None


def test_what_a_render_appends_to_the_conversation_it_continues():
    before = TOK.apply_chat_template(EXCHANGE, tokenize=False)
    after = TOK.apply_chat_template([*EXCHANGE, {"role": "user", "content": "hi"}], tokenize=False,
                                    add_generation_prompt=True)
    assert conversation.appended(before, after) == f"{IM_START}user\nhi{IM_END}\n{IM_START}assistant\n"
    assert conversation.appended(before, after[1:]) is None  # the earlier turns rendered differently


def test_the_close_leaves_out_the_stop_token_the_policy_sampled():
    close = f"{IM_END}\n"
    assert conversation.close_after(TOK, close, ids("7") + [TOK.eos_token_id]) == "\n"
    assert conversation.close_after(TOK, close, ids("7")) == close  # cut off at max_new_tokens: the template closes it
    assert conversation.close_after(TOK, close, []) == close


def test_the_continuation_appends_the_rest_of_the_close_and_the_new_text():
    completion = ids("7") + [TOK.eos_token_id]
    new = f"{IM_START}user\nhi{IM_END}\n"
    assert conversation.continuation_ids(TOK, f"{IM_END}\n", completion, new) == ids("\n" + new)
    assert conversation.continuation_ids(TOK, f"{IM_END}\n", ids("7"), new) == ids(f"{IM_END}\n" + new)

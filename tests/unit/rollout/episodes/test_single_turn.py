"""Unit tests for ``lit_ppo.rollout.episodes.single_turn``: SingleTurnWorkflow's batches, laid out by hand.

Expected batches are written out by hand from the character-level test tokenizer (pad 0, eos 1,
<|system|> 2, <|user|> 3, <|assistant|> 4, then one id per character), never derived from the code.
"""

from __future__ import annotations

import pytest
import torch

from lit_ppo.config import RolloutConfig
from lit_ppo.models.sampling import allowed_mask, sampling_logprobs
from lit_ppo.rollout.engines.hf import HFEngine
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks.base import Problem
from tests.unit.fakes import FakeEngineBase

# one_thread is an autouse fixture: importing it applies it to this module too.
from tests.unit.rollout.engines.test_hf import one_thread, tiny_model, tiny_tokenizer  # noqa: F401

PAD, EOS, SYSTEM, USER, ASSISTANT = 0, 1, 2, 3, 4


def c(ch: str) -> int:
    """Id of one character: digits come first after the 5 special tokens, then a-z, then ' +-*=?.:'."""
    return 5 + (("0123456789abcdefghijklmnopqrstuvwxyz +-*=?.:").index(ch))


class FakeTask:
    """Exact-match reward that records every call; completions may use digits and EOS."""

    name = "fake"

    def __init__(self):
        self.calls: list[tuple[Problem, str]] = []

    def problems(self, split):
        return []

    def reward(self, problem, completion):
        self.calls.append((problem, completion))
        return 1.0 if completion == problem.answer else 0.0

    def allowed_completion_tokens(self, tokenizer):
        return [EOS] + [c(d) for d in "0123456789"]


class FakeEngine(FakeEngineBase):
    """Returns fixed completions per prompt and records what it was asked."""

    def __init__(self, completions: list[list[Completion]], version: int = 7):
        self.completions, self.version = completions, version
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    def generate(self, prompts, params):
        self.calls.append((prompts, params))
        return self.completions


PROBLEMS = [Problem(prompt="1+1", answer="2"), Problem(prompt="10+20", answer="30")]
ROLLOUT = RolloutConfig()
COMPLETIONS = [
    [Completion([c("2"), EOS], [-0.5, -0.125], stopped=True, version=7),          # "2": correct
     Completion([c("3"), EOS], [-1.0, -0.25], stopped=True, version=7)],          # "3": wrong
    [Completion([c("3"), c("0"), EOS], [-0.75, -0.5, -0.0625], stopped=True, version=7),  # "30": correct
     Completion([c("3")] * 4, [-1.0, -2.0, -3.0, -4.0], stopped=False, version=7)],       # "3333": truncated
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_single_turn_batch_fields_exactly(tok):
    task, engine = FakeTask(), FakeEngine(COMPLETIONS, version=7)
    params = SamplingParams(n=2, max_new_tokens=4, temperature=0.7, seed=11)
    batch = SingleTurnWorkflow(tok, task, params, ROLLOUT).run(engine, PROBLEMS)

    p0 = [USER, c("1"), c("+"), c("1"), EOS, ASSISTANT]                     # 6 prompt tokens
    p1 = [USER, c("1"), c("0"), c("+"), c("2"), c("0"), EOS, ASSISTANT]    # 8 prompt tokens
    assert engine.calls[0][0] == [p0, p1]
    # Rows: 6+2, 6+2, 8+3, 8+4 tokens; T = 12.
    assert batch.input_ids.tolist() == [
        p0 + [c("2"), EOS] + [PAD] * 4,
        p0 + [c("3"), EOS] + [PAD] * 4,
        p1 + [c("3"), c("0"), EOS] + [PAD],
        p1 + [c("3")] * 4,
    ]
    F, T = False, True
    assert batch.attention_mask.tolist() == [[T] * 8 + [F] * 4, [T] * 8 + [F] * 4, [T] * 11 + [F], [T] * 12]
    assert batch.loss_mask.tolist() == [
        [F] * 6 + [T, T] + [F] * 4,
        [F] * 6 + [T, T] + [F] * 4,
        [F] * 8 + [T, T, T] + [F],
        [F] * 8 + [T] * 4,
    ]
    assert batch.behave_logp.dtype == torch.float32
    assert batch.behave_logp.tolist() == [
        [0.0] * 6 + [-0.5, -0.125] + [0.0] * 4,
        [0.0] * 6 + [-1.0, -0.25] + [0.0] * 4,
        [0.0] * 8 + [-0.75, -0.5, -0.0625] + [0.0],
        [0.0] * 8 + [-1.0, -2.0, -3.0, -4.0],
    ]
    assert batch.versions.tolist() == [
        [-1] * 6 + [7, 7] + [-1] * 4,
        [-1] * 6 + [7, 7] + [-1] * 4,
        [-1] * 8 + [7, 7, 7] + [-1],
        [-1] * 8 + [7] * 4,
    ]
    assert batch.turn_ids.tolist() == [
        [-1] * 6 + [0, 0] + [-1] * 4,
        [-1] * 6 + [0, 0] + [-1] * 4,
        [-1] * 8 + [0, 0, 0] + [-1],
        [-1] * 8 + [0] * 4,
    ]
    assert batch.rewards.dtype == torch.float32 and batch.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert batch.truncated.tolist() == [False, False, False, True]
    assert batch.group_sizes.tolist() == [2, 2]
    assert batch.prompts == ["1+1", "1+1", "10+20", "10+20"]
    assert batch.completions == ["2", "3", "30", "3333"]
    # The reward saw the decoded text without special tokens, with the right problem.
    assert task.calls == [(PROBLEMS[0], "2"), (PROBLEMS[0], "3"), (PROBLEMS[1], "30"), (PROBLEMS[1], "3333")]


def test_params_are_sent_as_given(tok):
    engine = FakeEngine(COMPLETIONS)
    SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=2, seed=4, top_p=0.5), ROLLOUT).run(engine, PROBLEMS)
    sent = engine.calls[0][1]
    assert sent.allowed_token_ids is None  # no restriction unless the caller asks for the task's
    assert (sent.n, sent.seed, sent.top_p) == (2, 4, 0.5)

    engine = FakeEngine(COMPLETIONS)
    SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=2, allowed_token_ids=[1, 5]), ROLLOUT).run(engine, PROBLEMS)
    assert engine.calls[0][1].allowed_token_ids == [1, 5]


def test_run_seed_overrides_params_seed(tok):
    engine = FakeEngine(COMPLETIONS)
    workflow = SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=2, seed=4), ROLLOUT)
    workflow.run(engine, PROBLEMS, seed=99)
    workflow.run(engine, PROBLEMS)
    assert [params.seed for _, params in engine.calls] == [99, 4]


def test_system_prompt_precedes_the_user_message(tok):
    engine = FakeEngine(COMPLETIONS[:1])
    workflow = SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=2), RolloutConfig(system_prompt="be brief"))
    workflow.run(engine, PROBLEMS[:1])
    system = [SYSTEM] + [c(ch) for ch in "be brief"] + [EOS]
    assert engine.calls[0][0] == [system + [USER, c("1"), c("+"), c("1"), EOS, ASSISTANT]]


def test_group_sizes_are_n_per_problem(tok):
    problems = PROBLEMS + [Problem(prompt="2+2", answer="4")]
    engine = FakeEngine([[Completion([c("4"), EOS], [-0.5, -0.5], stopped=True, version=0)]] * 3)
    batch = SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=1), ROLLOUT).run(engine, problems)
    assert batch.group_sizes.tolist() == [1, 1, 1]
    assert batch.rewards.tolist() == [0.0, 0.0, 1.0]


def test_wrong_number_of_completions_is_an_error(tok):
    engine = FakeEngine([COMPLETIONS[0][:1], COMPLETIONS[1][:1]])
    with pytest.raises(ValueError, match="expected n=2"):
        SingleTurnWorkflow(tok, FakeTask(), SamplingParams(n=2), ROLLOUT).run(engine, PROBLEMS)


def test_hf_engine_batch_is_label_aligned(tok):
    """End to end: behave_logp[t] equals the recomputed log p(token t | tokens < t) on loss-mask tokens."""
    model = tiny_model(len(tok))
    task = FakeTask()
    params = SamplingParams(n=3, max_new_tokens=6, temperature=0.7, top_k=8, top_p=0.9, seed=0,
                            allowed_token_ids=task.allowed_completion_tokens(tok))
    batch = SingleTurnWorkflow(tok, task, params, ROLLOUT).run(HFEngine(model, tok), PROBLEMS)
    dist = dict(temperature=0.7, top_k=8, top_p=0.9,
                allowed=allowed_mask(task.allowed_completion_tokens(tok), len(tok), "cpu"))
    with torch.no_grad():
        logits = model(batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    # Label alignment: the logits at t-1 predict token t.
    recomputed = sampling_logprobs(logits[:, :-1], batch.input_ids[:, 1:], **dist)
    mask = batch.loss_mask[:, 1:]
    torch.testing.assert_close(batch.behave_logp[:, 1:][mask], recomputed[mask], atol=1e-5, rtol=0)
    assert not batch.loss_mask[:, 0].any()
    assert (batch.versions[batch.loss_mask] == 0).all() and (batch.turn_ids[batch.loss_mask] == 0).all()
    generated = [[t for t, keep in zip(row, m) if keep]
                 for row, m in zip(batch.input_ids.tolist(), batch.loss_mask.tolist())]
    assert batch.completions == [tok.decode(ids, skip_special_tokens=True) for ids in generated]
    assert [call[1] for call in task.calls] == batch.completions

"""Unit tests for the multi-turn workflow: ``MultiTurnWorkflow`` on scripted engines and environments.

Expected batches are written out token by token from the tiny character-level tokenizer of
``lit_ppo.models`` (pad 0, end 1, <|user|> 2, <|assistant|> 3, <|system|> 4, unk 5, then one id per
character from 6), never derived from the code under test.
"""

from __future__ import annotations

import string

import pytest
import torch

from lit_ppo.algos import compute_advantages, validate_turn_ids
from lit_ppo.algos.advantages import last_generated_index
from lit_ppo.algos.lambda_fn import GaeLambdaContext
from lit_ppo.config import PPOActorConfig, RolloutConfig
from lit_ppo.models import TINY_CHAT_TEMPLATE, build_tiny_tokenizer
from lit_ppo.rollout.engines.protocol import Completion, SamplingParams
from lit_ppo.rollout.episodes.episode import turn_seed
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow
from lit_ppo.tasks import ArithmeticTask, CalculatorTask
from lit_ppo.tasks.base import Problem
from tests.unit.fakes import ScriptedEngine
from tests.unit.rollout.engines.test_hf import tiny_tokenizer as eos_terminated_tokenizer

PAD, END, USER, ASSISTANT, SYSTEM, UNK = 0, 1, 2, 3, 4, 5
CHARS = "0123456789+-*/=().,?: " + string.ascii_lowercase + string.ascii_uppercase


def c(text: str) -> list[int]:
    """Ids of the characters of ``text`` in the tiny tokenizer."""
    return [6 + CHARS.index(ch) for ch in text]


def user_turn(text: str) -> list[int]:
    """A chat-templated user message followed by the assistant generation prompt."""
    return [USER] + c(text) + [ASSISTANT]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


# ---------------------------------------------------------------- scripted engine and environment


class ScriptedEnv:
    """Replies with ``replies[k]`` (feedback, reward) to the k-th assistant turn; records what it saw."""

    def __init__(self, first: str, replies: list[tuple[str | None, float | None]]):
        self.first, self.replies, self.seen = first, replies, []

    def start(self):
        return self.first

    def step(self, completion):
        self.seen.append(completion)
        return self.replies[len(self.seen) - 1]


class ScriptedTask:
    """The k-th environment made for a problem replays ``scripts[prompt][k]``."""

    name = "scripted"

    def __init__(self, scripts: dict[str, list[list[tuple[str | None, float | None]]]]):
        self.scripts = scripts
        self.envs: list[ScriptedEnv] = []

    def problems(self, split):
        return []

    def reward(self, problem, completion):
        raise AssertionError("a multi-turn workflow asks the environment, not task.reward")

    def allowed_completion_tokens(self, tokenizer):
        return None

    def environment(self, problem):
        made = sum(1 for e in self.envs if e.first == problem.prompt)
        env = ScriptedEnv(problem.prompt, self.scripts[problem.prompt][made])
        self.envs.append(env)
        return env


def gen(ids: list[int], stopped: bool = True, first_logp: float = -0.5) -> Completion:
    """A completion whose token i has log-prob first_logp - i/8 (exact in float32)."""
    return Completion(list(ids), [first_logp - i / 8 for i in range(len(ids))], stopped,
                      version=-1)  # the engine tags it


# 2 problems x n=2: rows e0 (1 turn), e1 (3 turns, max_turns), e2 (2 turns, truncated), e3 (3 turns,
# environment ends it, never reports a reward; one completion holds a special token).
PROBLEMS = [Problem("1+1", "2"), Problem("2+3", "5")]
SCRIPTS = {
    "1+1": [[(None, 1.0)],
            [("no", 0.25), ("ok", None), ("more", 0.5)]],
    "2+3": [[("hi", 0.0), ("x", 0.75)],
            [("a", None), ("b", None), (None, None)]],
}
E0_T0 = gen(c("2") + [END], first_logp=-0.25)
E1_T0, E1_T1, E1_T2 = gen(c("ab") + [END]), gen(c("x") + [END], first_logp=-1.0), gen(c("y") + [END], first_logp=-2.0)
E2_T0, E2_T1 = gen(c("7") + [END], first_logp=-0.75), gen(c("9999"), stopped=False, first_logp=-1.5)
E3_T0, E3_T1, E3_T2 = gen(c("1") + [END], first_logp=-3.0), gen(c("2") + [SYSTEM, END]), gen(c("3") + [END])
ENGINE_SCRIPT = [[E0_T0, E1_T0, E2_T0, E3_T0],   # turn 0: all four episodes
                 [E1_T1, E2_T1, E3_T1],          # turn 1: e0 ended
                 [E1_T2, E3_T2]]                 # turn 2: e2 was truncated


def expected_rows():
    """Per row: pieces ('ctx', ids) or ('gen', completion, version, turn), written out by hand."""
    p0, p1 = user_turn("1+1"), user_turn("2+3")
    return [
        [("ctx", p0), ("gen", E0_T0, 7, 0)],
        [("ctx", p0), ("gen", E1_T0, 7, 0), ("ctx", user_turn("no")), ("gen", E1_T1, 8, 1),
         ("ctx", user_turn("ok")), ("gen", E1_T2, 9, 2)],
        [("ctx", p1), ("gen", E2_T0, 7, 0), ("ctx", user_turn("hi")), ("gen", E2_T1, 8, 1)],
        [("ctx", p1), ("gen", E3_T0, 7, 0), ("ctx", user_turn("a")), ("gen", E3_T1, 8, 1),
         ("ctx", user_turn("b")), ("gen", E3_T2, 9, 2)],
    ]


def row_ids(pieces) -> list[int]:
    return [t for piece in pieces for t in (piece[1] if piece[0] == "ctx" else piece[1].token_ids)]


def run_scripted(tok, discount=0.5, seed=11, max_turns=3):
    task = ScriptedTask(SCRIPTS)
    engine = ScriptedEngine(ENGINE_SCRIPT)
    workflow = MultiTurnWorkflow(tok, task, SamplingParams(n=2, max_new_tokens=4),
                                 RolloutConfig(max_turns=max_turns, turn_discount=discount))
    return workflow.run(engine, PROBLEMS, seed=seed), engine, task


# ---------------------------------------------------------------- the batch, field by field


def test_every_batch_field_of_a_scripted_rollout(tok):
    batch, _, _ = run_scripted(tok)
    rows = expected_rows()
    width = max(len(row_ids(r)) for r in rows)
    assert width == 5 + 3 + 4 + 2 + 4 + 2 and batch.input_ids.shape == (4, width)

    input_ids = torch.full((4, width), PAD)
    attention = torch.zeros(4, width, dtype=torch.bool)
    loss_mask = torch.zeros(4, width, dtype=torch.bool)
    logp = torch.zeros(4, width)
    versions = torch.full((4, width), -1)
    turns = torch.full((4, width), -1)
    for b, pieces in enumerate(rows):
        t = 0
        for piece in pieces:
            ids = piece[1] if piece[0] == "ctx" else piece[1].token_ids
            for i, token in enumerate(ids):
                input_ids[b, t], attention[b, t] = token, True
                if piece[0] == "gen":
                    loss_mask[b, t], logp[b, t] = True, piece[1].logprobs[i]
                    versions[b, t], turns[b, t] = piece[2], piece[3]
                t += 1
    torch.testing.assert_close(batch.input_ids, input_ids, rtol=0, atol=0)
    torch.testing.assert_close(batch.attention_mask, attention, rtol=0, atol=0)
    torch.testing.assert_close(batch.loss_mask, loss_mask, rtol=0, atol=0)
    torch.testing.assert_close(batch.behave_logp, logp, rtol=0, atol=0)
    torch.testing.assert_close(batch.versions, versions, rtol=0, atol=0)
    torch.testing.assert_close(batch.turn_ids, turns, rtol=0, atol=0)
    # reward = final reward x 0.5^(turns - 1): e0 1.0 x 1; e1 0.5 x 0.25; e2 0.75 x 0.5 (truncated
    # turn still scored); e3 no reward reported -> 0
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 0.125, 0.375, 0.0]), rtol=0, atol=0)
    assert batch.truncated.tolist() == [False, False, True, False]
    assert batch.group_sizes.tolist() == [2, 2]
    assert batch.prompts == ["1+1", "1+1", "2+3", "2+3"]
    assert batch.completions == [
        "2<|end|>",
        "ab<|end|><|user|>no<|assistant|>x<|end|><|user|>ok<|assistant|>y<|end|>",
        "7<|end|><|user|>hi<|assistant|>9999",
        "1<|end|><|user|>a<|assistant|>2<|system|><|end|><|user|>b<|assistant|>3<|end|>",
    ]


def test_prompts_are_token_ids_so_far_and_never_retokenised(tok):
    _, engine, _ = run_scripted(tok)
    rows = [row_ids(r) for r in expected_rows()]
    p0, p1 = user_turn("1+1"), user_turn("2+3")
    assert engine.prompts[0] == [p0, p0, p1, p1]
    # turn 1 prompts: everything up to (not including) turn 1's completion, of e1, e2, e3
    assert engine.prompts[1] == [rows[1][:5 + 3 + 4], rows[2][:5 + 2 + 4], rows[3][:5 + 2 + 3]]
    assert engine.prompts[2] == [rows[1][:5 + 3 + 4 + 2 + 4], rows[3][:5 + 2 + 3 + 3 + 3]]
    # the <|system|> id inside e3's second completion survives verbatim (a decode + encode of the
    # text the environment sees would have dropped it)
    assert engine.prompts[2][1][5 + 2 + 3: 5 + 2 + 3 + 3] == c("2") + [SYSTEM, END]
    assert all(p.n == 1 and p.max_new_tokens == 4 for p in engine.params)


def test_environments_see_the_decoded_text_of_each_turn(tok):
    _, _, task = run_scripted(tok)
    assert [env.seen for env in task.envs] == [["2"], ["ab", "x", "y"], ["7", "9999"], ["1", "2", "3"]]


def test_reward_lands_on_the_last_policy_token(tok):
    batch, _, _ = run_scripted(tok)
    lengths = [len(row_ids(r)) for r in expected_rows()]
    assert last_generated_index(batch.loss_mask).tolist() == [n - 1 for n in lengths]
    cfg = PPOActorConfig(kl_ctl=0.0, reward_norm=None, adv_norm=None, gae_timestep_unit="turn")
    adv = compute_advantages(batch.rewards, batch.loss_mask, cfg, group_sizes=batch.group_sizes,
                             truncated=batch.truncated, turn_ids=batch.turn_ids)
    # critic-free, gamma = lambda = 1: every generated token carries its row's reward
    expected = torch.tensor([1.0, 0.125, 0.375, 0.0])[:, None].expand_as(batch.loss_mask)
    torch.testing.assert_close(adv.advantages, torch.where(batch.loss_mask, expected, 0.0), rtol=0, atol=0)


def test_turn_ids_satisfy_the_contract_and_count_turns(tok):
    batch, _, _ = run_scripted(tok)
    validate_turn_ids(batch.turn_ids, batch.loss_mask)
    ctx = GaeLambdaContext.from_mask(batch.loss_mask, batch.turn_ids, "turn")
    assert ctx.turn_counts.tolist() == [1, 3, 2, 3]
    assert ctx.effective_token_lengths.tolist() == [2, 3 + 2 + 2, 2 + 4, 2 + 3 + 2]


def test_turn_discount_of_one_keeps_the_reward(tok):
    batch, _, _ = run_scripted(tok, discount=1.0)
    assert batch.rewards.tolist() == [1.0, 0.5, 0.75, 0.0]


def test_max_turns_one_is_single_turn(tok):
    batch, engine, task = run_scripted(tok, max_turns=1)
    assert len(engine.prompts) == 1
    assert batch.turn_ids.max(1).values.tolist() == [0, 0, 0, 0]
    # the reward each environment reported after its first turn
    assert batch.rewards.tolist() == [1.0, 0.25, 0.0, 0.0]
    assert batch.completions == ["2<|end|>", "ab<|end|>", "7<|end|>", "1<|end|>"]


# ---------------------------------------------------------------- seeds


def test_each_turn_samples_with_its_own_seed(tok):
    _, engine, _ = run_scripted(tok, seed=11)
    seeds = [p.seed for p in engine.params]
    assert len(set(seeds)) == 3 and 11 not in seeds
    assert all(isinstance(s, int) and 0 <= s < 2 ** 63 for s in seeds)
    assert [p.seed for p in run_scripted(tok, seed=11)[1].params] == seeds      # reproducible
    other = [p.seed for p in run_scripted(tok, seed=12)[1].params]
    assert not set(other) & set(seeds)                                         # another call, other streams
    assert seeds == [turn_seed(11, k) for k in range(3)]


def test_seed_defaults_to_params_seed(tok):
    def seeds(params_seed, seed):
        engine = ScriptedEngine(ENGINE_SCRIPT)
        params = SamplingParams(n=2, max_new_tokens=4, seed=params_seed)
        workflow = MultiTurnWorkflow(tok, ScriptedTask(SCRIPTS), params, RolloutConfig(max_turns=3))
        workflow.run(engine, PROBLEMS, seed=seed)
        return [p.seed for p in engine.params]

    assert seeds(5, None) == seeds(None, 5) == seeds(3, 5)
    assert seeds(None, None) == [None, None, None]   # the engine draws fresh randomness per call


# ---------------------------------------------------------------- custom workflows and the contract


class ReversedTurnsWorkflow(MultiTurnWorkflow):
    """A (broken) custom workflow that numbers the turns backwards."""

    def run(self, engine, problems, *, seed=None):
        batch = super().run(engine, problems, seed=seed)
        last = batch.turn_ids.max(1, keepdim=True).values
        batch.turn_ids = torch.where(batch.loss_mask, last - batch.turn_ids, -1)
        return batch


class TrainOnEverythingWorkflow(MultiTurnWorkflow):
    """A (broken) custom workflow that trains on prompt and feedback tokens but leaves their turn id -1."""

    def run(self, engine, problems, *, seed=None):
        batch = super().run(engine, problems, seed=seed)
        batch.loss_mask = batch.attention_mask.clone()
        return batch


@pytest.mark.parametrize("workflow_cls, rule", [(ReversedTurnsWorkflow, "temporally nondecreasing"),
                                                (TrainOnEverythingWorkflow, "must be non-negative")])
@pytest.mark.parametrize("gae_lambda", [1.0, "lit_ppo.algos.lambda_fn.relative_position_gae_lambda"])
def test_invalid_turn_ids_of_a_custom_workflow_name_the_broken_rule(tok, workflow_cls, rule, gae_lambda):
    workflow = workflow_cls(tok, ScriptedTask(SCRIPTS), SamplingParams(n=2, max_new_tokens=4),
                            RolloutConfig(max_turns=3))
    batch = workflow.run(ScriptedEngine(ENGINE_SCRIPT), PROBLEMS, seed=0)
    kwargs = {"q": 0.5} if isinstance(gae_lambda, str) else {}
    cfg = PPOActorConfig(kl_ctl=0.0, gae_timestep_unit="turn", gae_lambda=gae_lambda, gae_lambda_kwargs=kwargs)
    with pytest.raises(ValueError, match=rule):
        compute_advantages(batch.rewards, batch.loss_mask, cfg, group_sizes=batch.group_sizes,
                           truncated=batch.truncated, turn_ids=batch.turn_ids)


# ---------------------------------------------------------------- the calculator through the workflow


def test_calculator_episode_with_a_tool_call(tok):
    task = CalculatorTask(num_train=0, num_test=0)
    problems = [Problem("What is 2*3+1?", "7")]
    engine = ScriptedEngine([[gen(c("calc(2*3)") + [END]), gen(c("calc(1/0)") + [END])],
                             [gen(c("6") + [END]), gen(c("7") + [END])],
                             [gen(c("7") + [END])]])
    workflow = MultiTurnWorkflow(tok, task, SamplingParams(n=2, max_new_tokens=12),
                                 RolloutConfig(max_turns=3, turn_discount=0.5))
    batch = workflow.run(engine, problems, seed=1)
    prompt = user_turn("What is 2*3+1?")
    row0 = prompt + c("calc(2*3)") + [END] + user_turn("result: 6") + c("6") + [END] \
        + user_turn("wrong, try again") + c("7") + [END]
    row1 = prompt + c("calc(1/0)") + [END] + user_turn("error: division by zero") + c("7") + [END]
    assert len(row0) > len(row1)
    assert batch.input_ids[0].tolist() == row0
    assert batch.input_ids[1].tolist() == row1 + [PAD] * (len(row0) - len(row1))
    # row 0 answered right on its third turn (x 0.5^2), row 1 on its second (x 0.5)
    assert batch.rewards.tolist() == [0.25, 0.5]
    assert [len(p) for p in engine.prompts] == [2, 2, 1]
    assert batch.turn_ids.max(1).values.tolist() == [2, 1]
    validate_turn_ids(batch.turn_ids, batch.loss_mask)


# ---------------------------------------------------------------- chat templates


def test_feedback_after_an_eos_terminated_template():
    """A template that ends every message with <eos>: the user turn gets its <eos> too, and the policy's
    own <eos> closes the assistant turn (not repeated)."""
    tok = eos_terminated_tokenizer()
    task = ScriptedTask({"1+1": [[("ok", 0.0), (None, 1.0)]]})
    workflow = MultiTurnWorkflow(tok, task, SamplingParams(n=1, max_new_tokens=4),
                                 RolloutConfig(max_turns=2, system_prompt="s"))
    eos, user, assistant, system = 1, 3, 4, 2

    def ids(text):
        return [5 + (string.digits + string.ascii_lowercase + " +-*=?.:").index(ch) for ch in text]

    engine = ScriptedEngine([[gen(ids("2") + [eos])], [gen(ids("3") + [eos])]])
    batch = workflow.run(engine, [Problem("1+1", "2")], seed=0)
    expected = [system] + ids("s") + [eos, user] + ids("1+1") + [eos, assistant] + ids("2") + [eos] \
        + [user] + ids("ok") + [eos, assistant] + ids("3") + [eos]
    assert batch.input_ids[0].tolist() == expected


def test_template_with_a_default_system_prompt_is_not_repeated(tok):
    """Templates that add a default system message (e.g. SmolLM2's) to every render: the feedback turn
    must not carry it, so it is read off a full conversation, not rendered alone."""
    import copy

    tok = copy.deepcopy(tok)
    tok.chat_template = "{%- if messages[0]['role'] != 'system' -%}<|system|>d{%- endif -%}" + TINY_CHAT_TEMPLATE
    workflow = MultiTurnWorkflow(tok, ScriptedTask({}), SamplingParams(n=1), RolloutConfig(max_turns=2))
    assert workflow.prompt_ids("hi") == [SYSTEM] + c("d") + [USER] + c("hi") + [ASSISTANT]
    assert workflow.feedback_ids("ok", c("2") + [END]) == user_turn("ok")


def test_feedback_after_a_custom_stop_token_closes_the_assistant_turn(tok):
    workflow = MultiTurnWorkflow(tok, ScriptedTask({}), SamplingParams(n=1), RolloutConfig(max_turns=2))
    assert workflow.feedback_ids("ok", c("2.")) == [END] + user_turn("ok")   # '.' stopped it, not <|end|>
    assert workflow.feedback_ids("ok", c("2") + [END]) == user_turn("ok")


def test_template_that_is_not_prefix_stable_is_refused(tok):
    import copy

    tok = copy.deepcopy(tok)
    # renders only the last message: a conversation is not a prefix of its continuation
    tok.chat_template = "<|{{ messages[-1]['role'] }}|>{{ messages[-1]['content'] }}"
    with pytest.raises(ValueError, match="prefix of its continuation"):
        MultiTurnWorkflow(tok, ScriptedTask({}), SamplingParams(n=1), RolloutConfig(max_turns=2))


# ---------------------------------------------------------------- protocols and validation


def test_single_turn_task_is_refused(tok):
    with pytest.raises(TypeError, match="'arithmetic' has no environment"):
        MultiTurnWorkflow(tok, ArithmeticTask(num_train=0, num_test=0), SamplingParams(n=1), RolloutConfig())


def test_engine_answering_the_wrong_number_of_prompts_is_an_error(tok):
    workflow = MultiTurnWorkflow(tok, ScriptedTask(SCRIPTS), SamplingParams(n=2, max_new_tokens=4),
                                 RolloutConfig(max_turns=3))
    with pytest.raises(ValueError, match="completions for 3 prompts, expected 4"):
        workflow.run(ScriptedEngine([ENGINE_SCRIPT[0][:3]]), PROBLEMS)

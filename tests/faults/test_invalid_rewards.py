"""Rewards that are not finite real numbers fail the iteration (default) or drop their group."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from lit_ppo.__main__ import main
from lit_ppo.config import GenerationConfig, ModelConfig, NormConfig, PPOActorConfig, RolloutConfig
from lit_ppo.errors import RunStopped
from lit_ppo.models import build_tiny_tokenizer
from lit_ppo.rollout.engines.protocol import SamplingParams
from lit_ppo.rollout.episodes.episode import checked_reward
from lit_ppo.rollout.episodes.multi_turn import MultiTurnWorkflow
from lit_ppo.rollout.episodes.single_turn import SingleTurnWorkflow
from lit_ppo.tasks.base import Problem, reward_problem
from lit_ppo.training.datamodule import RolloutDataModule
from lit_ppo.training.module import LitPPO
from tests.faults import nan_task
from tests.integration.conftest import FAST, REPO
from tests.unit.fakes import ScriptedEngine
from tests.unit.rollout.episodes.test_multi_turn import END, ScriptedTask, c, gen

GROUP = NormConfig(mean_level="group", std_level="group")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> str:
    """One tiny-model cache for the module's runs (the model is built once)."""
    return str(tmp_path_factory.mktemp("model_cache"))
HINT = "rewards must be finite real numbers (set data.on_invalid_reward=drop to drop such groups)"


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture
def nan_task_registered():
    nan_task.register()
    yield
    nan_task.TASKS.unregister(nan_task.NAME)


# ---------------------------------------------------------------- what a reward is


@pytest.mark.parametrize("value,expected", [
    (0.5, 0.5), (1, 1.0), (-3, -3.0), (True, 1.0), (False, 0.0), (np.float32(0.25), 0.25), (np.int64(2), 2.0),
    (Fraction(1, 4), 0.25), (torch.tensor(0.75), 0.75), (torch.tensor(1, dtype=torch.int32), 1.0), (3.0e38, 3.0e38),
    (torch.tensor(True), 1.0), (np.bool_(True), 1.0), (np.array(0.5), 0.5),
])
def test_real_finite_numbers_are_rewards(value, expected):
    assert reward_problem(value) is None
    assert checked_reward(value, task="t", prompt="p", completion="c") == expected


@pytest.mark.parametrize("value,problem", [
    (math.nan, "not finite"), (math.inf, "not finite"), (-math.inf, "not finite"), (np.float64("nan"), "not finite"),
    (torch.tensor(float("nan")), "not finite"), (torch.tensor(float("inf")), "not finite"),
    (None, "not a real number"), ("1.0", "not a real number"), (1j, "not a real number"),
    (torch.tensor([1.0, 2.0]), "not a real number"), (torch.tensor([1.0]), "not a real number"),
    ([1.0], "not a real number"), (np.array([0.5]), "not a real number"), (torch.tensor(1 + 2j), "not a real number"),
    (np.str_("1"), "not a real number"), (np.array(math.nan), "not finite"),
    # Finite in Python, inf in the batch's float32 rewards.
    (1e39, "outside the float32 range"), (10 ** 400, "outside the float32 range"),
])
def test_other_values_are_not_rewards(value, problem):
    assert reward_problem(value) == problem
    with pytest.raises(RunStopped) as error:
        checked_reward(value, task="arithmetic", prompt="3+4=", completion="7")
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    assert str(error.value) == (f"task 'arithmetic' returned reward {shown} for prompt '3+4=' "
                                f"(completion '7'): {problem}; {HINT}")
    assert math.isnan(checked_reward(value, task="arithmetic", prompt="3+4=", completion="7", on_invalid="drop"))


def test_the_message_stays_one_short_line():
    prompt, completion = "line one\n" + "x" * 200, "a\nb" * 50
    with pytest.raises(RunStopped) as error:
        checked_reward("not\na\nnumber" * 20, task="t", prompt=prompt, completion=completion)
    message = str(error.value)
    assert "\n" not in message and len(message) < 360, message
    assert "for prompt 'line one\\nxxxx" in message


def test_on_invalid_reward_is_validated():
    with pytest.raises(ValueError, match=r"^data.on_invalid_reward='skip' is invalid: must be one of 'error', 'drop'$"):
        RolloutDataModule(on_invalid_reward="skip")


def test_bad_on_invalid_reward_fails_the_cli_in_one_line(capsys):
    assert main(["fit", "data.on_invalid_reward=skip"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: data.on_invalid_reward='skip' is invalid: must be one of 'error', 'drop'"


# ---------------------------------------------------------------- both workflows check every reward


class ValuesTask:
    """Single-turn task returning ``values[completion]``."""

    name = "values"

    def __init__(self, values):
        self.values = values

    def problems(self, split):
        return []

    def reward(self, problem, completion):
        return self.values[completion]

    def allowed_completion_tokens(self, tokenizer):
        return None


class FixedEngine(ScriptedEngine):
    """Returns ``groups`` (one list of completions per prompt) on every call."""

    def __init__(self, groups):
        super().__init__([])
        self.groups = groups

    def generate(self, prompts, params):
        return self.groups


def test_single_turn_names_the_task_prompt_completion_and_value(tok):
    task = ValuesTask({"7": 1.0, "8": float("nan")})
    engine = FixedEngine([[gen(c("7") + [END]), gen(c("8") + [END])]])
    workflow = SingleTurnWorkflow(tok, task, SamplingParams(n=2, max_new_tokens=4), RolloutConfig())
    with pytest.raises(RunStopped) as error:
        workflow.run(engine, [Problem("3+4=", "7")])
    assert str(error.value) == (f"task 'values' returned reward nan for prompt '3+4=' (completion '8'): "
                                f"not finite; {HINT}")

    dropping = SingleTurnWorkflow(tok, task, SamplingParams(n=2, max_new_tokens=4),
                                  RolloutConfig(on_invalid_reward="drop"))
    rewards = dropping.run(engine, [Problem("3+4=", "7")]).rewards
    assert rewards.dtype == torch.float32 and rewards[0] == 1.0 and torch.isnan(rewards[1])


def test_multi_turn_checks_each_reported_reward_and_ends_an_invalid_episode(tok):
    # Episode 0 reports None as "keep the last" (valid), then a string; episode 1 is fine.
    scripts = {"1+1": [[("go on", None), ("more", "bad"), (None, 1.0)], [(None, 0.5)]]}
    script = [[gen(c("ab") + [END]), gen(c("2") + [END])], [gen(c("cd") + [END])]]
    params = SamplingParams(n=2, max_new_tokens=4)
    workflow = MultiTurnWorkflow(tok, ScriptedTask(scripts), params, RolloutConfig(max_turns=3))
    with pytest.raises(RunStopped) as error:
        workflow.run(ScriptedEngine(script), [Problem("1+1", "2")])
    assert str(error.value) == (f"task 'scripted' returned reward 'bad' for prompt '1+1' (completion 'cd'): "
                                f"not a real number; {HINT}")

    dropping = MultiTurnWorkflow(tok, ScriptedTask(scripts), params,
                                 RolloutConfig(max_turns=3, on_invalid_reward="drop"))
    engine = ScriptedEngine(script)
    batch = dropping.run(engine, [Problem("1+1", "2")])
    assert len(engine.prompts) == 2  # the invalid reward ended episode 0: no third turn was asked for
    assert torch.isnan(batch.rewards[0]) and batch.rewards[1] == 0.5
    assert batch.turn_ids[0].max() == 1


# ---------------------------------------------------------------- the collector and the trainer


class Recorder(L.Callback):
    def __init__(self):
        self.metrics: list[dict[str, float]] = []
        self.rewards: list[torch.Tensor] = []
        self.groups: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})
        self.rewards.append(pl_module.last_batch.rewards.clone())
        self.groups.append(pl_module.last_batch.num_groups)


def fit(tmp_path, model_cache: str, max_steps: int, **data_kwargs):
    actor = PPOActorConfig(kl_ctl=0.0, ppo_n_minibatches=2, reward_norm=GROUP, optimizer={"lr": 1e-3})
    module = LitPPO(ModelConfig(cache_dir=model_cache), actor, None, algo="test")
    data = RolloutDataModule(batch_size=4, gconfig=GenerationConfig(n_samples=4, max_new_tokens=4,
                                                                    restrict_to_task_tokens=True), **data_kwargs)
    recorder = Recorder()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        callbacks=[recorder], limit_val_batches=0)  # counts the rewards of training alone
    trainer.fit(module, datamodule=data)
    return trainer, module, data, recorder


def test_drop_trains_on_full_batches_of_valid_groups_and_counts_the_dropped(tmp_path, model_cache,
                                                                           nan_task_registered):
    trainer, module, data, rec = fit(tmp_path, model_cache, max_steps=3, task=nan_task.NAME, on_invalid_reward="drop")
    assert trainer.global_step == 3 and module.version == 3
    dropped = [m["rollout/invalid_rewards"] for m in rec.metrics]
    assert sum(dropped) > 0, dropped
    # Every 7th reward was NaN: the collector sampled one more prompt (4 rewards) per dropped group.
    assert data.task.calls == 4 * (3 * 4 + int(sum(dropped)))
    assert rec.groups == [4, 4, 4] and all(bool(torch.isfinite(r).all()) for r in rec.rewards)
    assert [m["rollout/accepted"] for m in rec.metrics] == [4.0, 4.0, 4.0]
    assert all(math.isfinite(m["actor/loss"]) and math.isfinite(m["actor/grad_norm"]) for m in rec.metrics)
    for p in module.policy.parameters():
        assert bool(torch.isfinite(p).all())


def test_drop_of_every_group_still_ends_with_the_attempts_error(tmp_path, model_cache, nan_task_registered):
    with pytest.raises(RuntimeError, match=r"every one of the 8 groups tried was dropped for an invalid reward "
                                           r"\(data.on_invalid_reward=drop\), 0 accepted, fewer than "
                                           r"data.batch_size=4 within data.max_attempts_factor=2"):
        fit(tmp_path, model_cache, max_steps=1, task=nan_task.NAME, task_kwargs={"period": 1}, on_invalid_reward="drop",
            max_attempts_factor=2)


@pytest.mark.slow
@pytest.mark.parametrize("rollouts", [[], ["algo=icepop", "rollout.max_head_offpolicyness=1"]],
                         ids=["sync", "async"])
def test_cli_run_with_a_nan_reward_fails_naming_task_prompt_and_value(tmp_path, model_cache, rollouts):
    """The real CLI in a subprocess: the 7th reward (in the first iteration) is NaN; with asynchronous
    rollouts it is met on the producer thread and fails the run the same way."""
    driver = ("import sys; from tests.faults.nan_task import register; register(); "
              "from lit_ppo.__main__ import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "LIT_PPO_CACHE": model_cache,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = [*FAST, *rollouts, f"data.task={nan_task.NAME}", "+data.task_kwargs.period=7"]
    proc = subprocess.run([sys.executable, "-c", driver, "fit", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: task '{nan_task.NAME}' returned reward nan for prompt '"), proc.stderr[-2000:]
    assert "(completion '" in last and "data.on_invalid_reward=drop" in last
    log = Path(last.rsplit("(traceback in ", 1)[1].rstrip(")"))  # the traceback is kept in the run directory
    assert (tmp_path / log).is_file() and "RunStopped" in (tmp_path / log).read_text()
    # Nothing trained on the NaN: any checkpoint the run left holds finite weights only.
    for path in tmp_path.glob("runs/**/*.ckpt"):
        state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
        assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point()), path

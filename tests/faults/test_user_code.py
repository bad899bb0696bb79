"""The user's own code and model: a Task class that fails to construct or gives no usable problems, a module
that raises or exits when imported, allowed tokens outside the vocabulary, and a model directory whose weights
are missing, cut short or of another shape are each refused in one line naming the key, exit code 2, no
traceback."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lit_ppo.__main__ import main
from lit_ppo.config import GenerationConfig
from lit_ppo.errors import ConfigError
from lit_ppo.models import build_tiny, build_tiny_tokenizer, write_hf_files
from lit_ppo.training.datamodule import RolloutDataModule
from tests.faults.test_bad_input import error_of
from tests.integration.conftest import run_cli

TASKS = textwrap.dedent('''
    from lit_ppo.tasks.base import Problem


    class Base:
        name = "mine"

        def __init__(self, seed=0, n=2):  # the default data preset gives seed
            self.n = n

        def problems(self, split):
            return [Problem(prompt=f"{i}+{i}=", answer=str(2 * i)) for i in range(self.n)] if split == "train" else []

        def reward(self, problem, completion):
            return float(completion == problem.answer)

        def allowed_completion_tokens(self, tokenizer):
            return None


    class NeedsKey(Base):
        def __init__(self, seed=0, n=2):
            raise KeyError("dataset_dir")


    class Crashes(Base):
        def __init__(self, seed=0, n=2):
            raise RuntimeError("CUDA is not available")


    class Exits(Base):
        def __init__(self, seed=0, n=2):
            raise SystemExit("missing --data")


    class NoProblems(Base):
        def problems(self, split):
            return []


    class Dicts(Base):
        def problems(self, split):
            return [{"prompt": "1+1=", "answer": "2"}]


    class Generator(Base):
        def problems(self, split):
            return (Problem(prompt="1+1=", answer="2") for _ in range(2))


    class NumberPrompt(Base):
        def problems(self, split):
            return [Problem(prompt="1+1=", answer="2"), Problem(prompt=12, answer="2")]


    class NoTestSplit(Base):
        def problems(self, split):
            if split == "test":
                raise NotImplementedError("no test split")
            return super().problems(split)


    class WideTokens(Base):
        def allowed_completion_tokens(self, tokenizer):
            return [tokenizer.eos_token_id, 7, len(tokenizer), len(tokenizer) + 5]
''')
MODULES = {
    "user_tasks": TASKS,
    "exiting_task": "import sys\nsys.exit(3)\n",
    "raising_rewards": "raise RuntimeError('set REWARD_MODEL first')\n",
    "exiting_filter": "import sys\nsys.exit()\n",
    "needs_package": "import package_that_is_not_installed\n",
}


@pytest.fixture
def user_cwd(tmp_path, monkeypatch):
    """A working directory holding the user modules, removed from sys.modules afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory) -> str:
    """One tiny-model cache for the module's runs (the model is built once)."""
    return str(tmp_path_factory.mktemp("model_cache"))


# ---------------------------------------------------------------- a user Task class, user modules


@pytest.mark.slow
def test_a_module_that_exits_on_import(user_cwd, model_cache):
    result = run_cli(["fit", "data.task=exiting_task.MyTask", "logger=none"], user_cwd, timeout=120,
                     env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: data.task='exiting_task.MyTask' cannot be imported: importing module 'exiting_task' raised "
        "SystemExit: 3")
    assert not (user_cwd / "runs").exists()


@pytest.mark.parametrize("args,expected", [
    (["data.task=user_tasks.NeedsKey"],
     "data.task='user_tasks.NeedsKey' cannot be constructed: NeedsKey(seed=0) raised KeyError: 'dataset_dir'"),
    (["data.task=user_tasks.Crashes", "+data.task_kwargs.n=3"],
     "data.task='user_tasks.Crashes' cannot be constructed: Crashes(seed=0, n=3) raised RuntimeError: CUDA is not "
     "available"),
    (["data.task=user_tasks.Exits"],
     "data.task='user_tasks.Exits' cannot be constructed: Exits(seed=0) raised SystemExit: missing --data"),
    (["data.task=user_tasks.NoProblems"],
     "data.task='user_tasks.NoProblems' has no train problems: problems('train') returned an empty list"),
    (["data.task=user_tasks.Dicts"],
     "data.task='user_tasks.Dicts': problems('train')[0] is dict, not a lit_ppo.tasks.base.Problem"),
    (["data.task=user_tasks.Generator"],
     "data.task='user_tasks.Generator': problems('train') returned generator, not a sequence (list or tuple) of "
     "lit_ppo.tasks.base.Problem"),
    (["data.task=user_tasks.NumberPrompt"],
     "data.task='user_tasks.NumberPrompt': problems('train')[1].prompt is int, not a string"),
    (["data.task=user_tasks.NoTestSplit"],
     "data.task='user_tasks.NoTestSplit': problems('test') raised NotImplementedError: no test split"),
    (["data=dataset", "data.task_kwargs.train_path=train.jsonl", "data.task_kwargs.reward_fns=[raising_rewards.fn]"],
     "data.task_kwargs.reward_fns[0]='raising_rewards.fn' cannot be imported: importing module 'raising_rewards' "
     "raised RuntimeError: set REWARD_MODEL first"),
    (["data.dynamic_filter_fn=exiting_filter.keep"],
     "data.dynamic_filter_fn='exiting_filter.keep' cannot be imported: importing module 'exiting_filter' raised "
     "SystemExit"),
    (["data.task=needs_package.Task"],
     "data.task='needs_package.Task' cannot be imported: importing module 'needs_package' raised "
     "ModuleNotFoundError: No module named 'package_that_is_not_installed'"),
    (["actor.gae_lambda=exiting_task.lam"],
     "actor.gae_lambda='exiting_task.lam' cannot be imported: importing module 'exiting_task' raised SystemExit: 3"),
    (["trainer.callbacks=[{class_path: raising_rewards.Probe}]"],
     "trainer.callbacks.0.class_path='raising_rewards.Probe' cannot be imported: importing module 'raising_rewards' "
     "raised RuntimeError: set REWARD_MODEL first"),
])
def test_user_code_errors_name_the_key(capsys, user_cwd, no_model_loading, args, expected):
    assert error_of(capsys, *args, "logger=none") == f"error: {expected}"


def test_allowed_tokens_outside_the_vocabulary(user_cwd, model_cache, monkeypatch, capfd):
    """Through the CLI in this process: the check needs the model's tokenizer, so the model loads first."""
    monkeypatch.setenv("LIT_PPO_CACHE", model_cache)
    code = main(["fit", "data.task=user_tasks.WideTokens", "gconfig.restrict_to_task_tokens=true", "logger=none",
                 "trainer.max_steps=1"])
    err = capfd.readouterr().err
    vocab = len(build_tiny_tokenizer())
    assert code == 2, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"error: data.task='user_tasks.WideTokens' with gconfig.restrict_to_task_tokens=true: "
        f"allowed_completion_tokens returned 2 token id(s) outside the tokenizer's vocabulary of {vocab} "
        f"(ids 0 to {vocab - 1}): {vocab}, {vocab + 5}")


class Allowing:
    """A task whose allowed completion tokens are ``ids`` (or what calling it raises)."""

    def __init__(self, ids):
        self.ids = ids

    def allowed_completion_tokens(self, tokenizer):
        if isinstance(self.ids, Exception):
            raise self.ids
        return self.ids


@pytest.mark.parametrize("ids,expected", [
    ([1, -1], "returned 1 token id(s) outside the tokenizer's vocabulary of {vocab} (ids 0 to {last}): -1"),
    ([1, True, 2.0], "returned 2 token id(s) outside the tokenizer's vocabulary of {vocab} (ids 0 to {last}): "
                     "True, 2.0"),
    ([], "returned no token ids (None allows all)"),
    (7, "returned int, not a list of token ids or None"),
    (ValueError("the tokenizer has no single token for 'c'"),
     "raised ValueError: the tokenizer has no single token for 'c'"),
])
def test_every_kind_of_bad_allowed_tokens(ids, expected):
    tokenizer = build_tiny_tokenizer()
    data = RolloutDataModule(gconfig=GenerationConfig(restrict_to_task_tokens=True))
    data.task, data.task_spec = Allowing(ids), "mine.Task"
    data.trainer = SimpleNamespace(lightning_module=SimpleNamespace(tokenizer=tokenizer, policy=None))
    with pytest.raises(ConfigError) as error:
        data.setup("fit")
    vocab = len(tokenizer)
    assert str(error.value) == (f"data.task='mine.Task' with gconfig.restrict_to_task_tokens=true: "
                                f"allowed_completion_tokens {expected.format(vocab=vocab, last=vocab - 1)}")


# ---------------------------------------------------------------- a model directory that cannot be loaded


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model saved as a local Hugging Face directory."""
    root = tmp_path_factory.mktemp("model")
    write_hf_files(*build_tiny(cache_dir=root / "cache"), root / "tiny-dir")
    return root / "tiny-dir"


def variant(model_dir: Path, tmp_path: Path, config: dict | None = None) -> Path:
    """A copy of ``model_dir`` with ``config`` merged into its config.json."""
    copy = tmp_path / "my-model"
    shutil.copytree(model_dir, copy)
    if config:
        path = copy / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return copy


@pytest.mark.slow
def test_truncated_weights_are_refused_before_loading(model_dir, tmp_path, model_cache):
    copy = variant(model_dir, tmp_path)
    weights = copy / "model.safetensors"
    full = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:full // 2])
    result = run_cli(["fit", f"model={copy}", "logger=none"], tmp_path, timeout=120,
                     env={"LIT_PPO_CACHE": model_cache})
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: model={copy} has a damaged weight file: model.safetensors is truncated ({full // 2} bytes of the "
        f"{full} its header describes)")


def _without_weights(path: Path) -> None:
    (path / "model.safetensors").unlink()


def _header_only(path: Path) -> None:
    (path / "model.safetensors").write_bytes(b"\x00\x01")


def _sharded(path: Path) -> None:
    """Weights split into two shards by an index; the second shard file is gone."""
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    save_file({n: weights[n] for n in names[:5]}, path / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: shard for shard, ns in shards.items() for n in ns}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("config,damage,expected", [
    (None, _without_weights, "has no weights (none of model.safetensors, model.safetensors.index.json, "
                             "pytorch_model.bin, pytorch_model.bin.index.json)"),
    (None, _header_only, "has a damaged weight file: model.safetensors is truncated (2 bytes, less than its header)"),
    (None, _sharded, "is missing model-00002-of-00002.safetensors, listed in its model.safetensors.index.json"),
    ({"intermediate_size": 256}, None, "has the weight model.layers.0.mlp.gate_proj.weight of shape [128, 64], but "
                                       "config.json's LlamaForCausalLM needs [256, 64] (a config.json of another "
                                       "model size?)"),
    ({"num_hidden_layers": 3}, None, "lacks the weight model.layers.2.self_attn.q_proj.weight that config.json's "
                                     "LlamaForCausalLM has"),
])
def test_every_kind_of_bad_weights(capsys, model_dir, tmp_path, no_model_loading, config, damage, expected):
    copy = variant(model_dir, tmp_path, config)
    if damage is not None:
        damage(copy)
    assert error_of(capsys, f"model={copy}", "logger=none") == f"error: model={copy} {expected}"
    assert error_of(capsys, f"model.source={copy}", "logger=none") == f"error: model.source={copy} {expected}"


def test_a_load_error_after_the_checks_is_one_line(model_dir, tmp_path, model_cache, monkeypatch, capfd):
    copy = variant(model_dir, tmp_path)
    (copy / "tokenizer.json").write_text("{not json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIT_PPO_CACHE", model_cache)
    code = main(["fit", f"model={copy}", "logger=none", "trainer.max_steps=1"])
    err = capfd.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: model.source={copy} cannot be loaded: JSONDecodeError: ")

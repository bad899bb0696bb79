"""``lit_ppo.launch.check.check_sft_config``: the sft job's tree checked as a fit's, each mistake one line
before anything loads; the examples tokenised by the model's tokenizer alone."""

from __future__ import annotations

import json

import pytest

from lit_ppo.config.sft import SFTConfig
from lit_ppo.errors import ConfigError
from lit_ppo.launch.check import check_sft_config
from lit_ppo.launch.compose import compose
from lit_ppo.launch.sft import sft_tree


@pytest.fixture
def sums(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(5) for b in range(4)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["data=dataset", "data.task_kwargs.train_path=sums.jsonl", f"model.cache_dir={tmp_path / 'cache'}"]


def tree_of(overrides: list[str], sft: SFTConfig | None = None) -> dict:
    return sft_tree(compose(overrides), sft or SFTConfig())


def test_a_good_tree_passes_and_accumulation_is_honoured_by_sft(sums):
    check_sft_config(tree_of([*sums, "logger=none", "trainer.accumulate_grad_batches=2"]))


@pytest.mark.parametrize("overrides, line", [
    (["model.teacher=tiny"], "model.teacher=tiny is fit's (algo=opd, algo=kdrl)"),
    (["trainer=fsdp"], "trainer.strategy="),
    (["actor.optimizer.lr=-1"], "actor.optimizer.lr=-1 is invalid"),
    (["+trainer.max_stepz=3"], "trainer.max_stepz is not a key"),
    (["logger.init_args.run_name=" + "x" * 300], "logger.init_args.run_name="),
])
def test_mistakes_are_fits_lines(sums, overrides, line):
    with pytest.raises(ConfigError, match="^" + line.replace("(", r"\(").replace(")", r"\)")):
        check_sft_config(tree_of([*sums, *overrides]))


def test_an_example_longer_than_max_length_is_refused_naming_its_row(sums):
    with pytest.raises(ConfigError, match=r"^sums.jsonl line \d+ is \d+ tokens, more than sft.max_length=5"):
        check_sft_config(tree_of([*sums, "logger=none"], SFTConfig(max_length=5)))


CHECK_VALUES = '''
import sys
from lit_ppo.errors import ConfigError
from lit_ppo.launch.check import check_values
from lit_ppo.launch.compose import compose
try:
    check_values(compose(["logger=none", "data=dataset", "data.task_kwargs.train_path=rows.jsonl",
                          "data.task_kwargs.reward_fns=[%s]"]))
except ConfigError as e:
    print("error:", e)
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "lightning", "transformers", "openai"}))
'''


@pytest.mark.parametrize("reward, out", [
    ("exact_match", "['torch']"),  # the names the actor refers to are registered with the losses
    ("rewards.nope", "error: data.task_kwargs.reward_fns[0]='rewards.nope' cannot be imported (module 'rewards' has "
                     "no 'nope'): give a dotted path module.function\n[]"),
])
def test_the_value_checks_load_no_lightning_and_the_task_no_torch(tmp_path, reward, out):
    import subprocess
    import sys

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n"
                                                 for a in range(4)))
    (tmp_path / "rewards.py").write_text("")
    result = subprocess.run([sys.executable, "-c", CHECK_VALUES % reward], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, out), result.stderr


"""``--help`` of every subcommand and ``--version``: fit's keys under the command line's names, each with its
docstring's first sentence (read here from the source by its own rule), its type and the value of the chosen
presets (checked against the config ``fit`` composes); Lightning's flags behind ``--help-all``; the other
subcommands' options described; none of it loads torch or Lightning."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import os
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest
import yaml

from lit_ppo.cli import main
from lit_ppo.config import EvalConfig, GenerationConfig, ModelConfig, PPOActorConfig, PPOCriticConfig, RolloutConfig
from lit_ppo.config.keys import ROLLOUT_KEYS
from lit_ppo.launch.compose import compose

ROOT = Path(__file__).resolve().parents[3]
LINE = re.compile(r"^  (\S+?)=(.*?)(?:  \((.*)\))?$")
"""A key's line: ``  actor.eps_clip=0.2  (float)``; its doc follows on lines indented by six spaces."""


def _help(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def _keys(text: str) -> dict[str, tuple[str, str | None, str]]:
    """key -> (value as shown, type, doc joined)."""
    out: dict[str, tuple[str, str | None, str]] = {}
    key = None
    for line in text.splitlines():
        found = LINE.match(line)
        if found and not line.startswith("   "):
            key = found.group(1)
            out[key] = (found.group(2), found.group(3), "")
        elif line.startswith("      ") and key is not None:
            value, kind, doc = out[key]
            out[key] = (value, kind, (doc + " " + line.strip()).strip())
        else:
            key = None
    return out


def _field_docs(cls) -> dict[str, str]:
    """field -> the first sentence of the string literal under it in ``cls``'s source."""
    source = textwrap.dedent(inspect.getsource(cls))
    docs = {}
    for name, doc in re.findall(r'^    (\w+): [^\n]*\n    """(.*?)"""', source, re.M | re.S):
        flat = " ".join(doc.split())
        stops = [m.start() for m in re.finditer(r"\.(\s|$)", flat) if not re.search(r"(e\.g|i\.e)$", flat[: m.start()])]
        docs[name] = flat[: stops[0] + 1] if stops else flat
    return docs


def _flat(cls, values: dict, prefix: str) -> dict[str, object]:
    """Every key of the dataclass ``cls`` (nested dataclasses flattened) -> the composed value or the default."""
    out = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        default = (field.default if field.default is not dataclasses.MISSING else
                   field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        value = values.get(field.name, default) if isinstance(values, dict) else default
        nested = next((t for t in typing.get_args(hints[field.name]) or (hints[field.name],)
                       if dataclasses.is_dataclass(t)), None)
        if nested is not None:
            if not isinstance(value, dict):
                if not dataclasses.is_dataclass(value):
                    out[f"{prefix}.{field.name}"] = value
                value = {} if value is None else dataclasses.asdict(value)
            out.update(_flat(nested, value, f"{prefix}.{field.name}"))
        else:
            out[f"{prefix}.{field.name}"] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def _expected(overrides: list[str]) -> dict[str, object]:
    """What help must show for ``overrides``: the config fit composes, section by section."""
    tree = compose(overrides)
    model, data = tree["model"], tree["data"]
    expected = {**_flat(PPOActorConfig, model.get("actor") or {}, "actor"),
                **_flat(GenerationConfig, data.get("gconfig") or {}, "gconfig"),
                **_flat(EvalConfig, data.get("eval") or {}, "eval"),
                **_flat(ModelConfig, model.get("model") or {}, "model"),
                "data.task": data["task"], "seed": tree["seed_everything"]}
    if model.get("critic"):
        expected.update(_flat(PPOCriticConfig, model["critic"], "critic"))
    for key, value in _flat(RolloutConfig, data, "data").items():
        name = key.split(".", 1)[1]
        expected[f"rollout.{name}" if name in ROLLOUT_KEYS else key] = value
    for key, value in (data.get("task_kwargs") or {}).items():
        expected[f"data.task_kwargs.{key}"] = value
    for key, value in tree["trainer"].items():
        if key not in ("logger", "callbacks"):
            expected[f"trainer.{key}"] = value
    return expected


@pytest.mark.parametrize("overrides", [[], ["algo=dapo"], ["algo=ppo", "data=calculator"],
                                       ["recipe=smollm2_word_problems"],
                                       ["algo=icepop", "actor.eps_clip=0.3", "data.gconfig.n_samples=3"]])
def test_fit_help_shows_every_key_with_the_composed_value(capsys, overrides):
    shown = _keys(_help(capsys, "fit", *overrides, "--help"))
    expected = _expected(overrides)
    missing = sorted(set(expected) - set(shown))
    assert missing == []
    for key, value in expected.items():
        text = shown[key][0]
        parsed = yaml.safe_load(text) if text != "''" else ""
        if isinstance(value, str):
            parsed = text if text != "''" else ""
        if value == {} and text == "{}":  # an empty mapping the preset gives as null or {}
            continue
        assert parsed == value, f"{key}: help shows {text!r}, fit composes {value!r}"


def test_fit_help_documents_every_field_by_its_docstring(capsys):
    shown = _keys(_help(capsys, "fit", "algo=ppo", "--help"))
    checked = []

    def check(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for name, doc in _field_docs(cls).items():
            nested = next((t for t in typing.get_args(hints[name]) or (hints[name],) if dataclasses.is_dataclass(t)),
                          None)
            key = (f"rollout.{name}" if name in ROLLOUT_KEYS else f"data.{name}") if cls is RolloutConfig else \
                f"{prefix}.{name}"
            if nested is not None:
                check(nested, key)  # a section within the section: its fields carry the docs
                if key not in shown:
                    continue
            value, kind, text = shown[key]
            assert text == doc, key
            assert kind, f"{key} shows no type"
            checked.append(key)

    for section, cls in {"actor": PPOActorConfig, "critic": PPOCriticConfig, "gconfig": GenerationConfig,
                         "eval": EvalConfig, "model": ModelConfig, "data": RolloutConfig}.items():
        check(cls, section)
    assert {"actor.optimizer.lr", "critic.optimizer.lr", "actor.adv_norm.mean_level",
            "actor.rejection_sampling.upper", "rollout.engine", "data.batch_size"} <= set(checked)
    assert len(checked) > 100


def test_fit_help_by_hand(capsys):
    text = _help(capsys, "fit", "algo=dapo", "--help")
    shown = _keys(text)
    assert "  algo=dapo: DAPO: Yu et al. 2025" in text  # the preset file's opening comment
    assert shown["actor.eps_clip"] == ("0.2", "float", "Lower clip epsilon of the ratio; also the upper one when "
                                                       "eps_clip_higher is None.")
    assert shown["actor.eps_clip_higher"][:2] == ("0.28", "float | None")
    assert shown["data.dynamic_filter_fn"][0] == "lit_ppo.rollout.filters.mixed_outcomes"
    assert shown["trainer.max_steps"][0] == "100"
    assert shown["trainer.max_steps"][2].startswith("Stop training after this number of steps.")  # Lightning's doc
    assert "--help-all" in text and "--trainer.accelerator" not in text  # Lightning's flags only behind --help-all
    scheduler = _keys(_help(capsys, "fit", "scheduler=slurm", "--help"))
    assert scheduler["scheduler.time"][:2] == ("04:00:00", "str")
    assert scheduler["scheduler.nodes"][2] == "Nodes to allocate (``--nodes``); ``trainer.num_nodes`` follows."
    validate = _help(capsys, "validate", "--help")
    assert validate.startswith("usage: python -m lit_ppo validate|test --ckpt_path CKPT")
    assert "eval.k=4" in validate


def test_fit_help_of_a_model_directory_names_it(capsys):
    # Help composes without loading the model: any directory name is shown as given.
    model_dir = "out/my-model"
    text = _help(capsys, "fit", f"model={model_dir}", "--help")
    header = " ".join(text.split("presets (group=option):")[0].split())
    assert f"the presets chosen (algo=grpo model={model_dir} data=arithmetic " in header
    assert "model=tiny" not in header
    presets = " ".join(text.split("presets (group=option):")[1].split("actor:")[0].split())
    assert (f"model={model_dir}: a model directory or hub id (model.source), with the tiny preset's other settings "
            f"others: smollm2, tiny") in presets
    assert _keys(text)["model.source"][0] == model_dir
    # the presets' own models are named by their option, as before
    assert "the presets chosen (algo=grpo model=smollm2 " in " ".join(_help(capsys, "fit", "model=smollm2",
                                                                             "--help").split())


def test_fit_help_of_overrides_that_do_not_compose(capsys):
    assert main(["fit", "algo=GRPO", "--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: algo=GRPO is invalid") and "grpo" in err and err.count("\n") == 1


def test_help_all_is_lightning_clis_help(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--help-all"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--trainer.max_steps" in out and "--model.actor" in out


@pytest.mark.parametrize("subcommand,flags", [("export", ["--ckpt_path", "--output", "--adapter", "--overwrite"]),
                                              ("compare", ["--experiment", "--runs", "--metric", "--output"]),
                                              ("sweep", ["--experiment", "--metric", "--output"])])
def test_every_option_is_described(capsys, subcommand, flags):
    module = __import__(f"lit_ppo.cli.{subcommand}", fromlist=["parser"])
    actions = [a for a in module.parser()._actions]
    assert sorted(o for a in actions for o in a.option_strings) == sorted(flags)
    assert all(len(a.help or "") > 20 for a in actions)
    text = _help(capsys, subcommand, "--help")
    assert text.startswith(f"usage: python -m lit_ppo {subcommand}")
    for action in actions:
        assert action.option_strings[0] in text
        assert " ".join(action.help.split()[:4]) in " ".join(text.split())


def test_sft_help_lists_every_sft_key_with_its_default(capsys):
    from dataclasses import fields

    from lit_ppo.config.sft import SFTConfig

    text = _help(capsys, "sft", "--help")
    assert text.startswith("usage: python -m lit_ppo sft [group=option ...]")
    for field in fields(SFTConfig):
        assert re.search(rf"^  sft\.{field.name}={re.escape(repr(field.default))}  \S", text, re.M), field.name


def test_version(capsys):
    text = _help(capsys, "--version")
    assert text.startswith(f"lit_ppo {importlib.metadata.version('lit_ppo')} (")
    assert f"torch {importlib.metadata.version('torch')}" in text


def test_the_lit_ppo_command_is_python_m_lit_ppo(capsys, tmp_path):
    """The console command that installing the package puts beside the interpreter (``.venv/bin/lit-ppo``)
    runs the same command line, from any directory, whether the environment is activated or not."""
    command = Path(sys.executable).parent / "lit-ppo"
    assert command.is_file(), f"{command}: not installed (make setup installs the package)"
    main(["--help"])
    expected = capsys.readouterr().out
    # not activated: the environment's bin directory is not on the PATH
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PATH": "/usr/bin:/bin",
           "LIT_PPO_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([str(command), "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, expected, "")
    refused = subprocess.run([str(command), "fit", "learning_rate=1e-6"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, env=env)
    assert (refused.returncode, refused.stderr) == (
        2, "error: learning_rate is not a key: TRL's learning_rate is actor.optimizer.lr\n")


def without_torch(calls: str) -> subprocess.CompletedProcess:
    """A new interpreter running ``calls`` (with ``main`` of lit_ppo.cli imported); its exit code is 1 if
    torch, Lightning or transformers were loaded (the first of them on stderr)."""
    code = ("import sys; from lit_ppo.cli import main\n" + calls + "\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'transformers'))\n"
            "print(loaded[:3], file=sys.stderr); sys.exit(bool(loaded))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_help_loads_neither_torch_nor_lightning():
    result = without_torch(
        "for args in (['fit', '--help'], ['fit', 'algo=ppo', 'trainer=ddp', 'data=gsm8k', '--help'],\n"
        "             ['validate', '--help'], ['sft', '--help'],\n"
        "             ['export', '--help'], ['compare', '--help'], ['sweep', '--help'], ['--version']):\n"
        "    assert main(args) == 0, args")
    assert result.returncode == 0, result.stderr


MISTAKES = {
    "algo=GRPO": "error: algo=GRPO is invalid (did you mean algo=grpo?): must be one of cispo, clip_cov, dapo, "
                 "dapo_dynamic_bs, dppo, drgrpo, gdpo, gmpo, gpg, grpo, gspo, icepop, kdrl, kl_cov, kpop, liteppo, "
                 "m2po, opd, ppo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo, sapo",
    "actor.eps_clipp=0.3": "error: actor.eps_clipp is not a key (did you mean actor.eps_clip?)",
    "actor.eps_clip=-1": "error: actor.eps_clip=-1 is invalid: must be a finite number >= 0.0",
    "gconfig.n_samples=x": "error: gconfig.n_samples='x' is invalid: must be an integer",
    "data.batch_sizee=3": "error: data.batch_sizee is not a key (did you mean data.batch_size?)",
    "data.gconfig.n_sample=3": "error: data.gconfig.n_sample is not a key (did you mean data.gconfig.n_samples?)",
    "scheduler.time=soon": "error: scheduler.time='soon' is invalid: must be a Slurm time limit: minutes, MM:SS, "
                           "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    "seed=-1": "error: seed=-1 is invalid: must be an integer in [0, 4294967295]",
}
"""A mistake in the composed sections -> its line, which comes before torch or Lightning loads."""


def test_config_mistakes_are_reported_before_torch_loads():
    result = without_torch(
        f"for override in {list(MISTAKES)!r}:\n"
        "    extra = ['scheduler=slurm'] if override.startswith('scheduler.') else []\n"
        "    assert main(['fit', *extra, override]) == 2, override")
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == list(MISTAKES.values())

"""``python -m lit_ppo fit|validate|test [group=option ...] [key=value ...] --help``: every key under the
name the command line takes (``actor.eps_clip``), grouped by section, each with its type, the value the
chosen presets give it and the first sentence of its docstring; Lightning's own flags are behind
``--help-all`` (LightningCLI's help).

The presets are composed as ``fit`` composes them and the docs are read from the source files
(``lit_ppo.utils.source_docs``), so help loads neither torch nor Lightning.
"""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lit_ppo.cli import PROG, SUBCOMMANDS
from lit_ppo.cli.args import print_error
from lit_ppo.config.keys import ROLLOUT_KEYS
from lit_ppo.errors import ConfigError
from lit_ppo.launch.explain import explain_hydra_error
from lit_ppo.launch.presets import (
    EVALUATING,
    conf_dir,
    follow_sampling_temperature,
    group_options,
    groups,
    is_group,
    register_resolvers,
    typed_overrides,
)
from lit_ppo.utils.source_docs import (
    NO_DEFAULT,
    FieldDoc,
    args_section,
    class_doc,
    dataclass_fields,
    method_doc,
    summary,
)

PACKAGE = Path(__file__).resolve().parents[1]
"""The lit_ppo package directory, whose source files hold the docs."""


class Section(NamedTuple):
    """A section of keys documented by a dataclass's fields."""

    name: str
    """The section as typed (``actor``)."""
    source: str
    """The file of the dataclass, relative to the package."""
    cls: str
    """The dataclass."""
    keys: tuple[str, ...] = ()
    """Only these fields (all when empty)."""
    skip: tuple[str, ...] = ()
    """Fields shown in another section."""
    title: str = ""
    """What the section holds; "": the dataclass docstring's first sentence."""


DATACLASS_SECTIONS = (
    Section("actor", "config/algo.py", "PPOActorConfig"),
    Section("critic", "config/algo.py", "PPOCriticConfig"),
    Section("gconfig", "config/algo.py", "GenerationConfig"),
    Section("eval", "config/algo.py", "EvalConfig"),
    Section("model", "config/model.py", "ModelConfig"),
    Section("checkpoint", "config/checkpoint.py", "CheckpointConfig"),
    Section("samples", "config/samples.py", "SamplesConfig"),
    Section("data", "config/rollout.py", "RolloutConfig", skip=ROLLOUT_KEYS),
    Section("rollout", "config/rollout.py", "RolloutConfig", keys=ROLLOUT_KEYS,
            title="the engine that samples the rollouts (rollout=hf or vllm) and the bounds on its log-probs"),
)
"""Sections in the order help shows them; the data section also has ``data.task`` and ``data.task_kwargs``."""
DATA_MODULE = ("training/datamodule.py", "RolloutDataModule")
"""Where ``data.task`` and ``data.task_kwargs`` are documented (its ``Args:``)."""
SCHEDULERS = {"slurm": ("config/scheduler.py", "SlurmConfig"), "ray": ("config/scheduler.py", "RayConfig")}
"""The scheduler options with settings: the dataclass of each."""
SEED_DOC = "One seed per run: Lightning's global RNGs and the rollouts' prompt order and sampling (data.seed)."


def main(argv: list[str]) -> int:
    """Print the help of ``argv[0]`` (fit, validate or test) for the presets its overrides choose; the
    exit code (2 for overrides that do not compose)."""
    subcommand = argv[0]
    overrides = [arg for arg in argv[1:] if not arg.startswith("-")]
    try:
        tree, chosen = composed(overrides)
    except ConfigError as e:
        print_error(str(e))
        return 2
    print(render(subcommand, tree, chosen, _width()))
    return 0


def composed(overrides: list[str]) -> tuple[dict, dict[str, str]]:
    """The presets chosen by ``overrides`` composed, with their ``key=value`` overrides on top, as the Hydra
    tree (resolved); and group -> chosen option."""
    register_resolvers()
    overrides = typed_overrides(overrides)
    chosen_groups = [o.lstrip("+") for o in overrides if is_group(o)]
    keys = [o.lstrip("+") for o in overrides if not is_group(o) and "=" in o]
    chosen = {group: None for group in groups()}
    for override in chosen_groups:
        group, _, option = override.partition("=")
        if group == "model" and option not in group_options("model"):  # model=DIR
            keys.append(f"model.source={option}")
            continue
        chosen[group] = option
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=[f"{g}={o}" for g, o in chosen.items() if o],
                                return_hydra_config=True)
        chosen = {group: cfg.hydra.runtime.choices[group] for group in chosen}
        OmegaConf.set_struct(cfg, False)  # the key overrides may add keys no preset sets
        del cfg["hydra"]
        for override in keys:
            key, _, value = override.partition("=")
            OmegaConf.update(cfg, key, yaml.safe_load(value) if value else None, force_add=True)
        _keep_machine_choices(cfg)
        tree = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(explain_hydra_error(e, group_options)) from None
    follow_sampling_temperature(tree.get("actor"), tree.get("gconfig"))
    return tree, chosen


def _keep_machine_choices(node) -> None:
    """Leave ``${on_gpu:a,b}`` unresolved: help shows both choices (and loads no torch to pick one)."""
    for key in list(node.keys() if OmegaConf.is_dict(node) else range(len(node))):
        child = node._get_node(key)
        if OmegaConf.is_config(child):
            _keep_machine_choices(child)
        elif child._is_interpolation() and "${on_gpu:" in str(child._value()):
            node[key] = str(child._value()).replace("${", "\\${")


def render(subcommand: str, tree: dict, chosen: dict[str, str], width: int = 100) -> str:
    """The help text of ``subcommand`` for the composed Hydra ``tree`` of the presets ``chosen``."""
    usage = SUBCOMMANDS["validate" if subcommand in EVALUATING else subcommand].usage
    out = ["usage: " + "\n       ".join(f"{PROG} {line}" for line in usage), ""]
    if subcommand in EVALUATING:
        out += _wrap(f"{subcommand} scores the task's test split (eval.*). With --ckpt_path CKPT the checkpoint's "
                     f"own config is used and only eval.*, gconfig.*, rollout.*, data.* and trainer.* can change; "
                     f"without it, the keys below compose as fit's.", width, "") + [""]
    model_dir = _model_dir(tree, chosen["model"])
    shown = {**chosen, "model": model_dir or chosen["model"]}
    out += _wrap("key=value sets a key; the values shown are those of the presets chosen "
                 f"({' '.join(f'{g}={o}' for g, o in shown.items())}).", width, "")
    out += ["", "presets (group=option):"]
    for group, option in chosen.items():
        options = [o for o in group_options(group) if o != option or (group == "model" and model_dir)]
        summary_line = f"{group}={option}: {_preset_summary(group, option)}"
        if group == "model" and model_dir:
            summary_line = (f"model={model_dir}: a model directory or hub id (model.source), with the {option} "
                            f"preset's other settings")
        out += textwrap.wrap(summary_line, width, initial_indent="  ", subsequent_indent="      ",
                             break_on_hyphens=False)
        out += _wrap("others: " + ", ".join(options), width, "      ")
    for section in DATACLASS_SECTIONS:
        values = tree.get(section.name, {}) if section.name != "rollout" else tree.get("rollout", {})
        out += ["", f"{section.name}: {section.title}" if section.title else
                _section_title(section.name, section.source, section.cls)]
        if section.name == "critic" and not values:
            out.append("  (no critic with these presets: the critic keys apply to algo=ppo)")
            continue
        if section.name == "data":
            out += _data_task_lines(tree.get("data") or {}, width)
        out += _dataclass_lines(section, values or {}, width)
    out += _trainer_lines(tree.get("trainer") or {}, width)
    out += ["", "logger: the logger preset's settings (logger=mlflow, csv, tensorboard, wandb or none)"]
    out += _value_lines("logger", tree.get("logger") or {}, width)
    out += _scheduler_lines(chosen.get("scheduler"), tree.get("scheduler") or {}, width)
    known = {s.name for s in DATACLASS_SECTIONS} | {"trainer", "logger", "scheduler", "seed"}
    for name in (key for key, value in tree.items() if key not in known and isinstance(value, dict)):
        out += ["", f"{name}:"] + _value_lines(name, tree[name], width)
    out += ["", "seed:", f"  seed={_shown(tree.get('seed'))}  (int)"] + _wrap(SEED_DOC, width)
    out += ["", "more:"]
    out += _wrap(f"{PROG} {subcommand} --help-all: LightningCLI's help, every Lightning flag "
                 f"(--trainer.*, --ckpt_path, --config, --print_config, ...)", width, "  ")
    out += _wrap(f"{PROG} {subcommand} [overrides] --print_config: the whole resolved config", width, "  ")
    out += _wrap("${on_gpu:a,b}: a on a machine with CUDA devices, else b; ???: required, no preset gives it", width,
                 "  ")
    out += _wrap("a model directory or hub id (any model.source but tiny, or a directory lit_ppo wrote from the "
                 "tiny model) trains with a real model's learning rate (1e-6, TRL's and verl's) and no entropy bonus "
                 "unless given; the tiny preset's suit only the tiny model (a note at fit start names them; give the "
                 "model to this help to see the values)", width, "  ")
    return "\n".join(out)


def _model_dir(tree: dict, option: str) -> str | None:
    """The model directory or hub id that ``model=DIR`` (or ``model.source=DIR``) gave on top of the model
    preset ``option``; None when the model is the preset's own."""
    source = (tree.get("model") or {}).get("source")
    preset = OmegaConf.load(conf_dir() / "model" / f"{option}.yaml").get("model", {}).get("source")
    return None if source is None or source == preset else str(source)


def _width() -> int:
    return max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))


def _wrap(text: str, width: int, indent: str = "      ") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False) or []


def _shown(value: Any) -> str:
    """``value`` as typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else "''"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _preset_summary(group: str, option: str) -> str:
    """The first sentence of the comment that opens the preset's file."""
    lines = (conf_dir() / group / f"{option}.yaml").read_text(encoding="utf-8").splitlines()
    comment = []
    for line in lines:
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            comment.append(line.lstrip("# "))
    return summary(" ".join(comment))


def _section_title(name: str, source: str, cls: str) -> str:
    return f"{name}: {summary(class_doc(PACKAGE / source, cls))}"


def _field_lines(key: str, field: FieldDoc, value: Any, width: int) -> list[str]:
    shown = "(required)" if value is NO_DEFAULT else _shown(value)
    return [f"  {key}={shown}  ({field.annotation})"] + _wrap(summary(field.doc), width)


def _dataclass_lines(section: Section, values: dict, width: int, prefix: str = "") -> list[str]:
    """A line and a doc line per field of ``section``'s dataclass, nested dataclasses flattened."""
    return _fields_lines(PACKAGE / section.source, section.cls, values, width, prefix or section.name,
                         section.keys, section.skip)


def _fields_lines(path: Path, cls: str, values: dict, width: int, prefix: str, keys: tuple[str, ...] = (),
                  skip: tuple[str, ...] = ()) -> list[str]:
    out = []
    for field in dataclass_fields(path, cls):
        if (keys and field.name not in keys) or field.name in skip:
            continue
        value = values.get(field.name, field.default) if isinstance(values, dict) else field.default
        key = f"{prefix}.{field.name}"
        if field.nested and isinstance(value, dict) or value is NO_DEFAULT:
            out += [f"  {key}: {summary(field.doc)}"]
        else:
            out += _field_lines(key, field, value, width)
        if field.nested:  # its keys, with the preset's values or the defaults
            out += _fields_lines(path, field.nested, value if isinstance(value, dict) else {}, width, key)
    return out


def _data_task_lines(data: dict, width: int) -> list[str]:
    """``data.task`` and the task's settings (``data.task_kwargs.*``) as the preset gives them."""
    docs = args_section(class_doc(PACKAGE / DATA_MODULE[0], DATA_MODULE[1]))
    out = [f"  data.task={_shown(data.get('task'))}  (str)"] + _wrap(
        summary(docs["task"]).rstrip(".") + ", or the dotted path of a Task class (docs/bring-your-own.md).", width)
    out += [f"  data.task_kwargs: {summary(docs['task_kwargs'])}"]
    out += _value_lines("data.task_kwargs", data.get("task_kwargs") or {}, width)
    return out


def _value_lines(prefix: str, values: dict, width: int) -> list[str]:
    """``prefix.key=value`` for every leaf of ``values`` (settings that no dataclass documents)."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out += _value_lines(f"{prefix}.{key}", value, width)
        else:
            out.append(f"  {prefix}.{key}={_shown(value)}")
    return out


def _trainer_lines(trainer: dict, width: int) -> list[str]:
    """The keys the trainer preset sets, with the Trainer's own docs; its callbacks by class."""
    out = ["", "trainer: Lightning Trainer arguments the trainer preset sets (trainer.<argument>=value sets any other)"]
    docs = _trainer_docs()
    for key, value in trainer.items():
        if key == "callbacks":
            names = [str(c.get("class_path", c)).rsplit(".", 1)[-1] for c in value or [] if isinstance(c, dict)]
            out.append(f"  trainer.callbacks=[{', '.join(names)}]")
            out += _wrap("Callbacks; a list given here replaces the preset's, --print_config shows their settings.",
                         width)
            continue
        out.append(f"  trainer.{key}={_shown(value)}")
        if key in docs:
            out += _wrap(summary(docs[key]), width)
    return out


def _trainer_docs() -> dict[str, str]:
    """The ``Args:`` of Lightning's ``Trainer.__init__``, read from its source (Lightning is not imported)."""
    spec = importlib.util.find_spec("lightning")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(spec.submodule_search_locations[0]) / "pytorch" / "trainer" / "trainer.py"
    return args_section(method_doc(path, "Trainer", "__init__")) if path.is_file() else {}


def _scheduler_lines(option: str | None, values: dict, width: int) -> list[str]:
    if option not in SCHEDULERS:
        return ["", f"scheduler: runs the fit in this process (scheduler=local); scheduler="
                    f"{' or scheduler='.join(SCHEDULERS)} lists its settings here"]
    source, cls = SCHEDULERS[option]
    settings = {k: v for k, v in values.items() if k != "type"}
    return ["", _section_title("scheduler", source, cls)] + _fields_lines(PACKAGE / source, cls, settings, width,
                                                                          "scheduler")

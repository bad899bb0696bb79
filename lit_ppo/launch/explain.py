"""The errors of the parsers behind ``python -m lit_ppo fit`` as one line naming the key the user typed
and what is allowed.

Each parser reports mistakes its own multi-line way: Hydra's override grammar and config composition,
PyYAML for ``--config`` files, jsonargparse for LightningCLI's typed arguments. The functions here
translate them into one line (the CLI prints it with exit code 2); lit_ppo.launch.check checks what can
be checked before the parsers run.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from lit_ppo.errors import ConfigError
from lit_ppo.utils.text import did_you_mean

# ---------------------------------------------------------------------------------------------
# Hydra
# ---------------------------------------------------------------------------------------------

def explain_hydra_error(error: Exception, options_of) -> str:
    """One line for a Hydra / OmegaConf composition error; ``options_of(group)`` lists a group's options."""
    text = str(error)
    first = text.splitlines()[0] if text else type(error).__name__
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = options_of(group)
        hint = did_you_mean(option, options, prefix=f"{group}=")
        return f"{group}={option} is invalid{hint}: must be one of {', '.join(options)}"
    parse = re.match(r"Error parsing override '(.*)'", first)
    if parse:
        reason = text.splitlines()[1] if len(text.splitlines()) > 1 else ""
        return (f"override {parse.group(1)!r} does not parse ({reason}): quote a value with special characters, "
                f"e.g. key='a (b)'")
    ambiguous = re.match(r"Ambiguous value for argument '(.*)'", first)
    if ambiguous:
        return (f"override {ambiguous.group(1)!r} is ambiguous: quote the value (key='a, b') or give a list "
                f"(key=[a,b])")
    merge = re.match(r"Error merging override ([^=]*)=(.*)", first)
    cause = str(error.__cause__ or "")
    kind = re.search(r"object_type=(dict|list)", cause)
    if merge and kind:  # a mapping or a list replaced by another kind of value
        allowed = "a mapping" if kind.group(1) == "dict" else "a list"
        return f"{merge.group(1)}={merge.group(2)} is invalid: must be {allowed}"
    full_key = getattr(error, "full_key", None)
    if "Missing mandatory value" in first and full_key:
        return f"{full_key} is required: give {full_key}=<value>"
    return first


# ---------------------------------------------------------------------------------------------
# --config files
# ---------------------------------------------------------------------------------------------

FILE_SECTIONS = ("model", "data", "trainer")
"""The sections of a ``--config`` file that its errors name (``--print_config`` writes ``seed_everything`` too)."""


def read_config_file(value: str) -> dict:
    """The mapping in a ``--config`` YAML file; ConfigError naming the file (and line, column)."""
    path = Path(value)
    if path.is_dir():
        raise ConfigError(f"--config {value} is a directory: give a YAML file (write one with --print_config)")
    if not path.is_file():
        raise ConfigError(f"--config {value}: no such file")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"--config {value}: {where}{e.problem or e.context} (not valid YAML)") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"--config {value} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    if loaded is None:
        raise ConfigError(f"--config {value} is empty: expected a mapping with keys {', '.join(FILE_SECTIONS)} "
                          f"(write one with --print_config)")
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {value} holds a {type(loaded).__name__}, expected a mapping with keys "
                          f"{', '.join(FILE_SECTIONS)}")
    return loaded


# ---------------------------------------------------------------------------------------------
# jsonargparse (LightningCLI's typed arguments)
# ---------------------------------------------------------------------------------------------

def _type_names(expected: list[str]) -> str:
    """``["typing.Literal[64, 32]", "<class 'int'>", "<class 'NoneType'>"]`` -> "64, 32, int or null"."""
    names: list[str] = []
    for text in expected:
        literal = re.fullmatch(r"typing\.Literal\[(.*)\]", text.strip())
        cls = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", text.strip())
        if literal:
            names += [v.strip() for v in literal.group(1).split(",")]
        elif cls:
            names.append("null" if cls.group(1) == "NoneType" else cls.group(1))
        else:
            names.append(text.strip())
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def explain_parser_error(error: BaseException) -> str:
    """One line for a jsonargparse error: the full key, the value given and the types it accepts."""
    text = str(error)
    keys = re.findall(r'Parser key "([^"]+)"', text)
    if keys:
        key = keys[0]
        owner = re.search(r"Problem with given class_path '(?:[\w.]+\.)?(\w+)'", text)
        if len(keys) > 1:
            key = f"{key} ({owner.group(1)}) {keys[-1]}" if owner else f"{key}.{keys[-1]}"
        block = text[text.rfind("Parser key"):]
        expected = re.findall(r"Expected an? (.+?)(?:\. Got value:.*)?$", block, re.M)
        given = re.search(r"(?:Given value|Got value): (.*)$", block, re.M)
        value = f"={given.group(1).strip()}" if given else ""
        if expected:
            return f"{key}{value} is invalid: expected {_type_names(expected)}"
        reason = [line.strip(" -") for line in block.splitlines()[1:] if line.strip(" -")]
        return f"{key}{value} is invalid" + (f": {reason[0]}" if reason else "")
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    for marker in ("is invalid", "is not a key", "must", "nrecognized arguments", "not a valid", "does not"):
        for line in lines:
            if marker in line:
                return line
    return lines[0] if lines else type(error).__name__

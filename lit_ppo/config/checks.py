"""The checks every config section is made of: a field against its declared type, a number in its range,
a choice among names, a nested config from a mapping; each error one line naming the field, the value
and what is allowed."""

from __future__ import annotations

import collections.abc
import functools
import math
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal, Union

from lit_ppo.utils.text import did_you_mean


def fail(name: str, value: Any, allowed: str) -> None:
    """ValueError ``<name>=<value!r> is invalid: must be <allowed>``: every config check's one line."""
    raise ValueError(f"{name}={value!r} is invalid: must be {allowed}")


# ---------------------------------------------------------------------------------------------
# declared types: every field of every config section is checked against its type hint here
# ---------------------------------------------------------------------------------------------

_SINGULAR = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
_PLURAL = {bool: "true or false values", int: "integers", float: "numbers", str: "strings"}


@functools.lru_cache(maxsize=None)
def type_hints(owner: Any) -> dict[str, Any]:
    """The resolved type hints of a dataclass or a function (``from __future__`` annotations are text)."""
    hints = typing.get_type_hints(owner)
    hints.pop("return", None)
    return hints


def _members(hint: Any) -> tuple:
    """The alternatives of a union (``X | Y``, ``Optional[X]``), else ``(hint,)``."""
    return typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)


def _unchecked(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return hint is Any or origin is collections.abc.Callable or isinstance(hint, (typing.TypeVar, str))


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value``, as YAML / Hydra / Python gives it, is of type ``hint``."""
    if _unchecked(hint):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_matches(value, member) for member in args)
    if origin is Literal:  # 1 == True: compare the type too
        return any(type(value) is type(choice) and value == choice for choice in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return not args or all(_matches(item, args[0]) for item in value)
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        key_hint, value_hint = args or (Any, Any)
        return all(_matches(k, key_hint) and _matches(v, value_hint) for k, v in value.items())
    if is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return True
        hints = type_hints(hint)
        return (isinstance(value, collections.abc.Mapping) and set(value) <= set(hints)
                and all(_matches(v, hints[k]) for k, v in value.items()))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a typing construct without a runtime check


def _join(words: list[str]) -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def describe(hint: Any, plural: bool = False) -> str:
    """What ``hint`` allows, in words: ``bool | None`` -> "true, false or null"."""
    members = _members(hint)
    if len(members) > 1:
        words: list[str] = []
        for member in members:
            words += ["true", "false"] if member is bool else [describe(member, plural)]
        return _join(words)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SINGULAR:
        return (_PLURAL if plural else _SINGULAR).get(hint, "null")
    if origin is Literal:
        return ("one of " if len(args) > 1 else "") + _join([repr(a) for a in args])
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        inner = "" if not args or _unchecked(args[0]) else " of " + describe(args[0], plural=True)
        return ("lists" if plural else "a list") + inner
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        inner = "" if not args or _unchecked(args[1]) else f" of {describe(args[0], True)} to {describe(args[1], True)}"
        return ("mappings" if plural else "a mapping") + inner
    if is_dataclass(hint):
        return f"a mapping of {hint.__name__} fields"
    return getattr(hint, "__name__", str(hint))


def check_value(name: str, value: Any, hint: Any) -> None:
    """ValueError ``<name>=<value!r> is invalid: must be <what hint allows>`` unless ``value`` is of
    type ``hint`` (bool only true / false, int not bool, float also int; Any and callables unchecked)."""
    if not _matches(value, hint):
        fail(name, value, describe(hint))


def check_fields(config: Any, section: str = "") -> None:
    """Check every field of the dataclass instance ``config`` against its declared type; errors name
    ``<section>.<field>`` (the bare field without a section)."""
    hints = type_hints(type(config))
    for f in fields(config):
        check_value(f"{section}.{f.name}" if section else f.name, getattr(config, f.name), hints[f.name])


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        fail(name, value, "one of " + ", ".join(repr(c) for c in choices))


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(name: str, value: Any, *, low: float | None = None, low_open: bool = False,
                  high: float | None = None, optional: bool = False) -> None:
    """Finite number within [low, high] (or (low, high] when ``low_open``)."""
    if value is None and optional:
        return
    lo = "" if low is None else (f" > {low}" if low_open else f" >= {low}")
    hi = "" if high is None else f" <= {high}"
    allowed = "a finite number" + (lo + (" and" if lo and hi else "") + hi if lo or hi else "")
    if optional:
        allowed += " or null"
    if not is_number(value) or not math.isfinite(value):
        fail(name, value, allowed)
    if low is not None and (value <= low if low_open else value < low):
        fail(name, value, allowed)
    if high is not None and value > high:
        fail(name, value, allowed)


def check_positive_int(name: str, value: Any, *, optional: bool = False) -> None:
    """An int >= 1 (not a bool), or None when ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        fail(name, value, "a positive integer" + (" or null" if optional else ""))


def as_config(cls: type, name: str, value: Any):
    """Nested configs arrive as dataclasses, mappings (YAML / Hydra) or None; an error of the nested
    config names its key under ``name`` (``reward_norm.eps``, ``critic.optimizer.lr``)."""
    if value is None or isinstance(value, cls) or not isinstance(value, collections.abc.Mapping):
        return value  # check_fields judges what is neither a config nor a mapping
    allowed = [f.name for f in fields(cls)]
    for key in value:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed, prefix=f"{name}.")
            raise ValueError(f"{name}.{key} is not a key{hint}; allowed: {', '.join(allowed)}")
    try:
        return cls(**value)
    except ValueError as e:
        message = str(e)
        parent, _, last = name.rpartition(".")
        if not message.startswith(last + "."):  # NormConfig's keys carry no section of their own
            message = f"{last}.{message}"
        raise ValueError(f"{parent}.{message}" if parent else message) from None

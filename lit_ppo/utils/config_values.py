"""Values of a config as code receives them: plain values (``is_plain``), and a node read and set alike
whether it is a mapping of the composed tree or a namespace that LightningCLI parsed (``config_value``)."""

from __future__ import annotations

from typing import Any

PLAIN_SCALARS = (bool, int, float, str, type(None))
"""Values that YAML and the command line type as they are; anything else (a function, a Task) is a
Python object."""


def is_plain(value: Any, scalars: tuple[type, ...] = PLAIN_SCALARS) -> bool:
    """Whether ``value`` holds only ``scalars``, in lists, tuples and mappings keyed by strings (by
    default: YAML the command line could type, no Python objects inside)."""
    if isinstance(value, (list, tuple)):
        return all(is_plain(v, scalars) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v, scalars) for k, v in value.items())
    return isinstance(value, scalars)


def config_value(node: Any, key: str) -> Any:
    """``node[key]`` of a mapping, else its attribute (a parsed Namespace, a dataclass); None if absent."""
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def set_config_value(node: Any, key: str, value: Any) -> None:
    """``node[key] = value`` of a mapping, else set its attribute (a parsed Namespace)."""
    if isinstance(node, dict):
        node[key] = value
    else:
        setattr(node, key, value)


def config_mapping(node: Any) -> dict:
    """``node``'s entries as a new dict ({} for None)."""
    if node is None:
        return {}
    return dict(vars(node)) if not isinstance(node, dict) else dict(node)

"""Import a user's object (task class, reward function) by dotted path, the working directory importable,
or take it from this process's Python objects (``object_reference``: what ``lit_ppo.compose`` was given).

``python -m lit_ppo`` already puts the working directory first on ``sys.path``, and a DDP launcher
re-runs the same ``-m`` command in the same directory; a run started otherwise (a script, an
installed entry point, ``python -c``) may not have it, so it is appended here before importing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

REFERENCE_PREFIX = "python:"
"""How a reference to a Python object of this process starts: ``python:<module>.<qualified name>``."""
_OBJECTS: dict[str, Any] = {}
"""Reference -> the Python object it stands for, in this process."""


def object_reference(obj: Any) -> str:
    """The name under which a config holds ``obj``, an object of this process (a function, a lambda, a Task
    class or instance): ``python:<module>.<qualified name>``. A function or class is known by that name, so
    that defining it again (re-running a notebook cell) names the same thing, now the newest definition;
    a lambda, a local function or an instance gets ``#2``, ``#3`` after it for another object of that name.
    ``import_object`` takes it back, in this process only."""
    for reference, known in _OBJECTS.items():
        if known is obj:
            return reference
    named = isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__")
    owner = obj if named else type(obj)
    base = f"{REFERENCE_PREFIX}{getattr(owner, '__module__', None) or 'object'}.{owner.__qualname__}"
    if named and "<" not in owner.__qualname__:
        _OBJECTS[base] = obj
        return base
    reference, n = base, 1
    while reference in _OBJECTS:
        n += 1
        reference = f"{base}#{n}"
    _OBJECTS[reference] = obj
    return reference


def is_object_reference(value: Any) -> bool:
    """Whether ``value`` is a reference that ``object_reference`` makes."""
    return isinstance(value, str) and value.startswith(REFERENCE_PREFIX)


def object_references(tree: Any, key: str = "") -> dict[str, str | list[str]]:
    """Dotted key -> the reference to a Python object it holds (the whole list, for a list that holds one), for
    every key of a config ``tree`` that holds one."""
    found: dict[str, str | list[str]] = {}
    if isinstance(tree, dict):
        for name, child in tree.items():
            found.update(object_references(child, f"{key}.{name}" if key else str(name)))
    elif isinstance(tree, list):
        if any(map(is_object_reference, tree)):
            found[key] = list(tree)
        for child in tree:
            found.update(object_references(child, key) if isinstance(child, (dict, list)) else {})
    elif is_object_reference(tree):
        found[key] = tree
    return found


def python_source(value: Any) -> str:
    """``value`` as Python source: a reference as the name its object had in its module
    (``python:__main__.correct#2`` -> ``correct``), a list item by item, anything else as its repr."""
    if isinstance(value, list):
        return f"[{', '.join(map(python_source, value))}]"
    if is_object_reference(value):
        return value.removeprefix(REFERENCE_PREFIX).split("#")[0].rsplit(".", 1)[-1]
    return repr(value)


def ensure_cwd_importable() -> None:
    """Append the working directory to ``sys.path`` unless it (or '') is already there."""
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.append(cwd)


def shadowing_file(package: str) -> str | None:
    """The file that ``import package`` would load instead of the installed package of that name (a user's
    ``mlflow.py`` in the working directory, first on ``sys.path``), or None."""
    found = sys.modules.get(package)
    spec = getattr(found, "__spec__", None) if found is not None else importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is not None:
        return None
    return spec.origin


def describe(error: BaseException) -> str:
    """``Type: first line of the message``, or the type alone for an error without one (``SystemExit()``)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def import_object(path: str, key: str, what: str) -> Any:
    """The object at dotted ``path`` (``module.name``); ValueError naming ``key`` and ``what`` was
    expected if it is not one or cannot be imported. A reference to a Python object (``object_reference``)
    is that object."""
    if is_object_reference(path):
        if path not in _OBJECTS:
            raise ValueError(f"{key}={path!r} was a Python object of the process that composed the config: give "
                             f"the object again (values={{{key.split('[')[0]!r}: ...}} of lit_ppo.compose, "
                             f"lit_ppo.validate or lit_ppo.test) or a dotted path module.{what}")
        return _OBJECTS[path]
    if not isinstance(path, str) or "." not in path.strip(".") or path.startswith(".") or path.endswith("."):
        raise ValueError(f"{key}={path!r} is invalid: must be a dotted path module.{what}")
    ensure_cwd_importable()
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # sys.exit() (argparse, click) at import time is a failure too
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module_name == e.name or module_name.startswith(e.name + "."))
        if missing:
            raise ValueError(f"{key}={path!r} cannot be imported ({describe(e)}): "
                             f"give a dotted path module.{what} "
                             f"importable from the working directory {os.getcwd()}") from None
        raise ValueError(f"{key}={path!r} cannot be imported: importing module {module_name!r} raised "
                         f"{describe(e)}") from None
    if not hasattr(module, attr):
        raise ValueError(f"{key}={path!r} cannot be imported (module {module_name!r} has no {attr!r}): "
                         f"give a dotted path module.{what}")
    return getattr(module, attr)


def import_function(path: str, key: str) -> Callable:
    """The function at dotted ``path`` (importable from the working directory); ValueError naming
    ``key`` if it cannot be imported or is not callable."""
    fn = import_object(path, key, "function")
    if not callable(fn):
        raise ValueError(f"{key}={path!r} is not a function")
    return fn

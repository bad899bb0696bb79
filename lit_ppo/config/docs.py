"""The documentation of a config field: the docstring written under it, as every config dataclass has."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """``{field: its docstring}`` of the dataclass ``cls`` and its bases, from the string literal under each
    annotated field in the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not hasattr(klass, "__dataclass_fields__"):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # defined where no source is kept (an interactive session)
            continue
        body = ast.parse(source).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` on one line: up to the first full stop followed by a space or the end."""
    flat = " ".join(text.split())
    for i, char in enumerate(flat):
        if char == "." and (i + 1 == len(flat) or flat[i + 1] == " ") and not flat[max(0, i - 3):i].endswith(("e.g", "i.e")):
            return flat[:i + 1]
    return flat

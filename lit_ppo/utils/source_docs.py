"""The documentation that lives in source files, read without importing them: the docstring under each
field of a dataclass (which Python does not keep at run time) and the ``Args:`` section of a docstring.
``fit --help`` shows them without loading torch or Lightning."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, NamedTuple

NO_DEFAULT = object()
"""The default of a field that has none, or one that is not a literal."""


class FieldDoc(NamedTuple):
    """One field of a dataclass, as its source declares it."""

    name: str
    annotation: str
    """The type as written (``float | None``)."""
    default: Any
    """The literal default (``[]`` / ``{}`` for ``default_factory=list`` / ``dict``), else ``NO_DEFAULT``."""
    doc: str
    """The docstring under the field, dedented; "" where there is none."""
    nested: str | None
    """The name of the dataclass of the same file that the type names (a section within the section)."""


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _default(node: ast.expr | None) -> Any:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        for keyword in node.keywords:
            if keyword.arg == "default":
                return _default(keyword.value)
            if keyword.arg == "default_factory" and isinstance(keyword.value, ast.Name):
                return {"list": [], "dict": {}}.get(keyword.value.id, NO_DEFAULT)
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NO_DEFAULT


def dataclass_fields(path: Path, class_name: str) -> list[FieldDoc]:
    """The fields of the dataclass ``class_name`` defined in the file ``path``, in order."""
    classes = _classes(path)
    body = classes[class_name].body
    out = []
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        doc = (after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
               and isinstance(after.value.value, str) else "")
        names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
        nested = next((name for name in sorted(names) if name in classes and name != class_name), None)
        out.append(FieldDoc(node.target.id, ast.unparse(node.annotation), _default(node.value), _dedent(doc), nested))
    return out


def class_doc(path: Path, class_name: str) -> str:
    """The docstring of the class ``class_name`` in the file ``path``."""
    return ast.get_docstring(_classes(path)[class_name]) or ""


def method_doc(path: Path, class_name: str, method: str) -> str:
    """The docstring of ``class_name.method`` in the file ``path``."""
    for node in _classes(path)[class_name].body:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            return ast.get_docstring(node) or ""
    return ""


def args_section(docstring: str) -> dict[str, str]:
    """The entries of a Google-style ``Args:`` section, name -> text (continuation lines joined)."""
    lines = docstring.expandtabs().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return {}
    entries: dict[str, str] = {}
    indent = None
    name = None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent or (depth == indent and line.strip().endswith(":") and " " not in line.strip()):
            break  # the next section (Returns:, Raises:)
        entry = re.match(r"\*{0,2}(\w+)(?: \([^)]*\))?: ?(.*)", line.strip()) if depth == indent else None
        if entry:
            name = entry.group(1)
            entries[name] = entry.group(2)
        elif name is not None:
            entries[name] += " " + line.strip()
    return entries


def args_entries(fields: list[FieldDoc], indent: int = 4) -> str:
    """``fields`` as entries of a Google-style ``Args:`` section, ``indent`` spaces in (their continuation
    lines four more): what ``args_section`` and docstring parsers read, for a class whose arguments are a
    dataclass's fields."""
    lines = []
    for field in fields:
        first, *rest = field.doc.splitlines() or [""]
        lines.append(f"{' ' * indent}{field.name}: {first}".rstrip())
        lines += [f"{' ' * (indent + 4)}{line}" if line.strip() else "" for line in rest]
    return "\n".join(lines)


def summary(text: str) -> str:
    """The first sentence of a docstring, on one line (a full stop after e.g., i.e., et al. ends none)."""
    flat = " ".join(text.split())
    for stop in re.finditer(r"\.(?=\s|$)", flat):
        if not re.search(r"\b(e\.g|i\.e|al|vs|cf)$", flat[: stop.start()]):
            return flat[: stop.start() + 1]
    return flat


def _dedent(text: str) -> str:
    lines = text.expandtabs().splitlines()
    if len(lines) <= 1:
        return text.strip()
    rest = [line for line in lines[1:] if line.strip()]
    cut = min((len(line) - len(line.lstrip()) for line in rest), default=0)
    return "\n".join([lines[0].strip(), *(line[cut:] for line in lines[1:])]).strip()

"""Text for one-line errors: the names closest to a mistyped one."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: str, allowed: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` names of ``allowed`` closest to ``name``, case ignored (``GRPO`` finds ``grpo``); none
    when ``name`` is one of them."""
    by_lower: dict[str, str] = {}
    for option in allowed:
        by_lower.setdefault(str(option).lower(), str(option))
    if name in by_lower.values():
        return []
    matches = difflib.get_close_matches(str(name).lower(), list(by_lower), n=n + 1, cutoff=cutoff)
    return [by_lower[m] for m in matches if by_lower[m] != name][:n]


def did_you_mean(name: str, allowed: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean <prefix><closest>?)`` for a mistyped ``name``, or "" when nothing is close."""
    close = closest(name, allowed)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def one_of(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

"""Text for one-line errors: the names closest to a mistyped one, the first line of an exception, a long
text shortened."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: str, allowed: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` names of ``allowed`` closest to ``name``, case ignored (``GRPO`` finds ``grpo``); none
    when ``name`` is one of them, and none that reads as another word (``_alike``)."""
    by_lower: dict[str, str] = {}
    for option in allowed:
        by_lower.setdefault(str(option).lower(), str(option))
    if name in by_lower.values():
        return []
    typed = str(name).lower()
    matches = difflib.get_close_matches(typed, list(by_lower), n=max(len(by_lower), 1), cutoff=cutoff)
    return [by_lower[m] for m in matches if by_lower[m] != name and _alike(typed, m)][:n]


def _alike(typed: str, option: str) -> bool:
    """Whether ``option`` could be what ``typed`` meant: word for word (split at ``_``) each word close to its
    own (``eps_clp``: ``eps_clip``), or the same letters but for the underscores (``drgrpo``: ``dr_grpo``). A
    name close in letters but of other words means something else: ``total_epochs`` is not ``max_epochs``,
    ``max_prompt_length`` not ``max_problems``."""
    if difflib.SequenceMatcher(None, typed.replace("_", ""), option.replace("_", "")).ratio() >= 0.9:
        return True
    words, option_words = typed.split("_"), option.split("_")
    return len(words) == len(option_words) and all(
        difflib.SequenceMatcher(None, word, other).ratio() >= 0.5 for word, other in zip(words, option_words))


def did_you_mean(name: str, allowed: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean <prefix><closest>?)`` for a mistyped ``name``, or "" when nothing is close."""
    close = closest(name, allowed)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def one_of(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to its first ``limit`` characters followed by ``...``, when it is longer than ``limit``."""
    return text if len(text) <= limit else text[:limit] + "..."


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, or its type's name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def first_sentence(error: BaseException) -> str:
    """The first sentence of the first line of ``error``'s message, without its full stop."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.split(". ", 1)[0].rstrip(".")

"""Name -> function registries: a new estimator or loss is one decorated function."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named table of functions filled by the ``register`` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._table: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._table[name] = fn
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        del self._table[name]

    def get(self, name: str) -> F:
        if name not in self._table:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}")
        return self._table[name]

    def names(self) -> list[str]:
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

"""Calls of a model-backed reward that wait at once, served by one batched computation.

``score_calls`` awaits the calls of a batch's prompt groups together; a reward model or a local judge
returns ``batched(items)``, and every call waiting then is served by one ``compute`` of all their items,
run on a worker thread so that the event loop (and the other rewards' requests) go on meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable


class BatchedCalls:
    """``await batched(items)``: ``compute(items of every waiting call)``'s results for ``items``, in order.

    Args:
        compute: a blocking function from a list of items to one result per item (it batches as it needs).
    """

    def __init__(self, compute: Callable[[list], list]):
        self.compute = compute
        self._waiting: deque[tuple[list, asyncio.Future]] = deque()
        self._serving = False
        self.computations = 0
        """``compute`` calls made so far."""

    async def __call__(self, items: list) -> list:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((list(items), future))
        if not self._serving:
            self._serving = True
            asyncio.ensure_future(self._serve())
        return await future

    async def _serve(self) -> None:
        """Compute for every waiting call, those that queue meanwhile included, then stop."""
        try:
            await asyncio.sleep(0)  # the calls awaited together queue first
            while self._waiting:
                calls = [call for call in (self._waiting.popleft() for _ in range(len(self._waiting)))
                         if not call[1].done()]  # a call past its timeout was cancelled
                if not calls:
                    continue
                self.computations += 1
                try:
                    results: list[Any] = await asyncio.to_thread(self.compute, [i for items, _ in calls for i in items])
                except Exception as e:
                    for _, future in calls:
                        if not future.done():
                            future.set_exception(e)
                    continue
                start = 0
                for items, future in calls:
                    if not future.done():
                        future.set_result(results[start:start + len(items)])
                    start += len(items)
        finally:
            self._serving = False

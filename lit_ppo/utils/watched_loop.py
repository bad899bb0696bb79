"""A coroutine run on an event loop of its own thread, watched from the thread that waits for it.

An ``asyncio`` timeout is a callback of the loop it guards: code that blocks the loop (an ``async def`` that
calls ``time.sleep`` or blocking I/O) holds that callback back too, and the timeout never fires. Watched from
another thread, a loop that has not come round for longer than a limit is noticed (``LoopBlocked``), and the
waiting thread, the main one where a stop signal is handled, is never held by the loop: on a signal's exception
or a blocked loop, the coroutine is cancelled as soon as its loop runs again and left behind where it blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any

WATCH_INTERVAL_S = 0.1
"""How often the loop records that it comes round, and the waiting thread looks."""
ABANDON_GRACE_S = 2.0
"""How long the waiting thread, given up, lets a loop that still runs finish cancelling its coroutine."""


class LoopBlocked(Exception):
    """The loop did not come round for longer than the limit: one step of its coroutine holds it."""


def run_watched(coroutine: Coroutine, blocked_after_s: float) -> Any:
    """``coroutine``'s result, run to its end as ``asyncio.run`` runs it (what it leaves running cancelled, the
    default executor shut down), on a new loop in a daemon thread. ``LoopBlocked`` once the loop has not come round
    for ``blocked_after_s`` seconds. On that, or on any exception in the waiting thread (a stop signal's), the
    coroutine is cancelled and waited for at most ``ABANDON_GRACE_S`` seconds."""
    loop = asyncio.new_event_loop()
    outcome: concurrent.futures.Future = concurrent.futures.Future()
    came_round = [time.monotonic()]

    async def watched() -> Any:
        beat = asyncio.ensure_future(_heartbeat(came_round))
        try:
            return await coroutine
        finally:
            beat.cancel()

    def serve() -> None:
        try:
            with asyncio.Runner(loop_factory=lambda: loop) as runner:
                result = runner.run(watched())
        except BaseException as e:  # handed to the waiting thread, whatever it is
            outcome.set_exception(e)
        else:
            outcome.set_result(result)

    threading.Thread(target=serve, name="lit_ppo-event-loop", daemon=True).start()
    try:
        while not outcome.done():
            concurrent.futures.wait([outcome], timeout=WATCH_INTERVAL_S)
            held = time.monotonic() - came_round[0]
            if not outcome.done() and held > blocked_after_s:
                raise LoopBlocked(f"the event loop has been held for {held:.0f} s")
        return outcome.result()
    except BaseException:
        if not outcome.done():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to cancel
                loop.call_soon_threadsafe(_cancel_all)
            concurrent.futures.wait([outcome], timeout=ABANDON_GRACE_S)
        raise


def _cancel_all() -> None:
    for task in asyncio.all_tasks():
        task.cancel()


async def _heartbeat(came_round: list[float]) -> None:
    while True:
        came_round[0] = time.monotonic()
        await asyncio.sleep(WATCH_INTERVAL_S)

"""Executor thread → event loop: a per-request event queue, for both surfaces.

The executor calls `put` from its thread; it schedules the event on the request's
asyncio queue and returns at once, so a slow client never blocks the executor.
`backlog` is what the executor reads to pause a sequence nobody reads (the stalled-reader
rule, engine/admission.py). Code on the loop thread (the request reader) uses `put_local`.
Once the request is gone, `orphans_to` hands what still arrives (a closed session's last
turn ends) to a handler instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LoopSink:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        # Each counter has one writer thread, so reading their difference is safe.
        self._num_put = 0  # executor thread
        self._num_taken = 0  # loop thread
        self._orphans: Callable[[object], None] | None = None  # loop thread

    @property
    def backlog(self) -> int:
        """Events the executor sent that the request has not consumed yet."""
        return self._num_put - self._num_taken

    def put(self, event: object) -> None:
        self._num_put += 1
        try:
            self._loop.call_soon_threadsafe(self._deliver, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _deliver(self, event: object) -> None:
        if self._orphans is not None:
            self._orphans(event)
        else:
            self._queue.put_nowait(event)

    def orphans_to(self, handler: Callable[[object], None]) -> None:
        """Nobody will `get` any more: the executor's events queued now, and every later one,
        go to `handler` on the loop thread."""
        self._orphans = handler
        while not self._queue.empty():
            event = self._queue.get_nowait()
            if not isinstance(event, _Local):
                handler(event)

    def put_local(self, event: object) -> None:
        self._queue.put_nowait(_Local(event))

    async def get(self) -> object:
        event = await self._queue.get()
        if isinstance(event, _Local):
            return event.event
        self._num_taken += 1
        return event


class _Local:
    __slots__ = ("event",)

    def __init__(self, event: object) -> None:
        self.event = event

"""Executor thread → event loop: one HTTP request's event queue.

The same bridge as transport/loop_sink.py (which gRPC uses; this wing may not import
it): the executor calls `put` from its thread, which schedules the event on the
request's asyncio queue and returns at once, so a slow HTTP reader never blocks the
executor. `backlog` is what the executor reads to pause a sequence nobody reads.
"""

from __future__ import annotations

import asyncio


class EventQueue:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._num_put = 0  # written by the executor thread only
        self._num_taken = 0  # written by the loop thread only

    @property
    def backlog(self) -> int:
        """Events the executor sent that the request has not consumed yet."""
        return self._num_put - self._num_taken

    def put(self, event: object) -> None:
        self._num_put += 1
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> object:
        event = await self._queue.get()
        self._num_taken += 1
        return event

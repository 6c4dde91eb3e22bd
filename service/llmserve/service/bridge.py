"""Executor thread → event loop: a per-request event queue.

The executor calls `put` from its thread; it schedules the event on the request's
asyncio queue and returns at once, so a slow client never blocks the executor.
Code on the loop thread (the request reader) uses `put_local`.
"""

from __future__ import annotations

import asyncio


class LoopSink:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    def put(self, event: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def put_local(self, event: object) -> None:
        self._queue.put_nowait(event)

    async def get(self) -> object:
        return await self._queue.get()

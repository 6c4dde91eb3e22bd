"""Executor thread → event loop: one call's event queue, for every surface.

The executor calls `put` from its thread; it schedules the event on the call's asyncio
queue and returns at once, so a slow client never blocks the executor. A call with
several sessions (one per prompt) gives each a tagged sink of its own (`tagged`): their
events share the first sink's queue, each with its tag, and each sink counts its own
`backlog`, what the executor reads to pause a session nobody reads (the stalled-reader
rule, engine/executor/admission.py): one session's unread events never pause another. Code on the
loop thread (the request reader) uses `put_local`. Once the call is gone, `orphans_to`
hands what still arrives (a closed session's last turn ends) to a handler instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable


class LoopSink:
    """An `EventSink`; the first of a call (`LoopSink(loop)`) owns the queue, its `tagged`
    siblings share it. Its own events and local ones come out of `get_tagged` with tag None."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tag: Hashable | None = None,
                 owner: LoopSink | None = None) -> None:
        self._loop = loop
        self.tag = tag
        self._owner = owner or self
        self._queue: asyncio.Queue[tuple[LoopSink | None, object]] = (
            owner._queue if owner is not None else asyncio.Queue())
        # Each counter has one writer thread, so reading their difference is safe.
        self._num_put = 0  # executor thread
        self._num_taken = 0  # loop thread
        self._orphans: Callable[[object], None] | None = None  # loop thread, the owner's

    def tagged(self, tag: Hashable) -> LoopSink:
        """A sink for one more session of this call: its events come out of `get_tagged` with `tag`."""
        return LoopSink(self._loop, tag, self._owner)

    @property
    def backlog(self) -> int:
        """Events the executor sent this sink that the call has not consumed yet."""
        return self._num_put - self._num_taken

    def put(self, event: object) -> None:
        self._num_put += 1
        try:
            self._loop.call_soon_threadsafe(self._owner._deliver, self, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _deliver(self, source: LoopSink, event: object) -> None:
        if self._orphans is not None:
            self._orphans(event)
        else:
            self._queue.put_nowait((source, event))

    def orphans_to(self, handler: Callable[[object], None]) -> None:
        """Nobody will `get` any more: the executor's events queued now, and every later one
        (of every sink of the call), go to `handler` on the loop thread."""
        owner = self._owner
        owner._orphans = handler
        while not owner._queue.empty():
            source, event = owner._queue.get_nowait()
            if source is not None:
                handler(event)

    def put_local(self, event: object) -> None:
        """From the loop thread: an event of the call's own (`get_tagged` gives it tag None)."""
        self._queue.put_nowait((None, event))

    async def get_tagged(self) -> tuple[Hashable | None, object]:
        """The next event of any sink of the call, and that sink's tag."""
        source, event = await self._queue.get()
        if source is None:
            return None, event
        source._num_taken += 1
        return source.tag, event

    async def get(self) -> object:
        return (await self.get_tagged())[1]

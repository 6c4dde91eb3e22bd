"""Executor thread → event loop: one call's event queue, for every surface.

The executor calls `put` from its thread; it schedules the event on the call's asyncio
queue and returns at once, so a slow client never blocks the executor. A call with
several sessions (one per prompt) gives each its own tagged view (`tagged`): their events
share the queue, each with its tag, and each view counts its own `backlog`, what the
executor reads to pause a session nobody reads (the stalled-reader rule,
engine/admission.py): one session's unread events never pause another. Code on the loop
thread (the request reader) uses `put_local`. Once the call is gone, `orphans_to` hands
what still arrives (a closed session's last turn ends) to a handler instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable


class TaggedSink:
    """One session's view of a `LoopSink`: its events carry `tag`; its own backlog."""

    def __init__(self, shared: LoopSink, tag: Hashable) -> None:
        self._shared = shared
        self.tag = tag
        # Each counter has one writer thread, so reading their difference is safe.
        self.num_put = 0  # executor thread
        self.num_taken = 0  # loop thread

    @property
    def backlog(self) -> int:
        """Events the executor sent this session that the call has not consumed yet."""
        return self.num_put - self.num_taken

    def put(self, event: object) -> None:
        self.num_put += 1
        self._shared.send(self, event)


class LoopSink:
    """An `EventSink` itself (its own events untagged: `tag` None), and the queue of its
    tagged views."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[TaggedSink | None, object]] = asyncio.Queue()
        self._own = TaggedSink(self, None)
        self._orphans: Callable[[object], None] | None = None  # loop thread

    def tagged(self, tag: Hashable) -> TaggedSink:
        """A sink for one more session of this call: its events come out of `get_tagged` with `tag`."""
        return TaggedSink(self, tag)

    @property
    def backlog(self) -> int:
        """Events the executor sent (untagged) that the call has not consumed yet."""
        return self._own.backlog

    def put(self, event: object) -> None:
        self._own.put(event)

    def send(self, source: TaggedSink, event: object) -> None:
        """From the executor thread: `event` of `source` onto the loop."""
        try:
            self._loop.call_soon_threadsafe(self._deliver, source, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _deliver(self, source: TaggedSink, event: object) -> None:
        if self._orphans is not None:
            self._orphans(event)
        else:
            self._queue.put_nowait((source, event))

    def orphans_to(self, handler: Callable[[object], None]) -> None:
        """Nobody will `get` any more: the executor's events queued now, and every later one,
        go to `handler` on the loop thread (untagged)."""
        self._orphans = handler
        while not self._queue.empty():
            source, event = self._queue.get_nowait()
            if source is not None:
                handler(event)

    def put_local(self, event: object) -> None:
        """From the loop thread: an event of the call's own (`get_tagged` gives it tag None)."""
        self._queue.put_nowait((None, event))

    async def get_tagged(self) -> tuple[Hashable | None, object]:
        """The next event and its session's tag (None: the sink's own, or a local event)."""
        source, event = await self._queue.get()
        if source is None:
            return None, event
        source.num_taken += 1
        return source.tag, event

    async def get(self) -> object:
        return (await self.get_tagged())[1]

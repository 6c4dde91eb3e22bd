"""Calls that have arrived but not yet opened a session: what an idle executor waits for
so that a burst of requests shares its first prefill (`engine/executor/burst.py`).

A surface counts each call from its first moment (`OpenCalls.counted` holds `arriving()`
for every call of both surfaces); the call has arrived once it opens a session
(`Call.open` calls `opened()` in the call's own asyncio task) or ends. Both run on the
event loop; the executor thread only reads (`recent`), which needs no lock under the GIL:
it copies the begin times in one C-level call.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

# The call's own way to say it has arrived: set in the call's task, as tracing's call is
_OPENED: ContextVar[Callable[[], None] | None] = ContextVar("llmserve_arrival_opened", default=None)


class Arrivals:
    def __init__(self) -> None:
        self._begun: dict[int, float] = {}  # calls not yet opened -> when each began (monotonic)
        self._ids = itertools.count()

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """One call, arriving until it opens a session or the block ends."""
        call_id = next(self._ids)
        self._begun[call_id] = time.monotonic()
        _OPENED.set(lambda: self._begun.pop(call_id, None))  # never reset: see tracing's _CURRENT
        try:
            yield
        finally:
            self._begun.pop(call_id, None)

    def recent(self, now: float, window_s: float) -> bool:
        """Some call began less than `window_s` ago and has not opened a session yet (an
        older one is a client that is slow to send, not part of a burst)."""
        return any(now - t < window_s for t in list(self._begun.values()))


def opened() -> None:
    """The current call opened its session: it has arrived (a no-op outside `arriving`)."""
    if (done := _OPENED.get()) is not None:
        done()

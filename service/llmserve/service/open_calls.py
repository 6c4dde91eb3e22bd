"""The calls open on every surface, counted once for the drain (process.py).

The gRPC and HTTP surfaces share one `OpenCalls`: each counts a call while it runs
(`counted`) and refuses new ones once `draining` (503 / UNAVAILABLE, each in its own
words); the process turns `begin_drain` on when the lame duck ends and waits for
`wait_idle` during the grace period. A surface that must tell its open calls (gRPC ends a
session once its open turn is done) registers `on_drain`. Event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator


class OpenCalls:
    def __init__(self) -> None:
        self.draining = False  # new calls are refused
        self._num_calls = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_drain: list[Callable[[], None]] = []

    def on_drain(self, hook: Callable[[], None]) -> None:
        """`hook` runs once, when the drain begins."""
        self._on_drain.append(hook)

    def begin_drain(self) -> None:
        """Refuse new calls from now on; the calls open go on (the grace period)."""
        self.draining = True
        for hook in self._on_drain:
            hook()

    @contextlib.contextmanager
    def counted(self) -> Iterator[None]:
        """One call, open until the block ends."""
        self._num_calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._num_calls -= 1
            if self._num_calls == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True once no call is open; False if some still are after `timeout` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

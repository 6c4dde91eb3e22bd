"""Admission shared by both surfaces: the sessions open on the engine (gRPC Generate
streams, OpenAI HTTP requests, each prompt of a /v1/completions) are capped at the slots
plus `--max-queue`, counted once, whichever wing opened them.

Beyond the cap a call is refused with `Overloaded` (each surface says it its own way),
and a retry hint from how long sessions have lasted lately. Runs on the event-loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..domain.errors import Overloaded

MAX_RETRY_AFTER_S = 30.0


class SessionGate:
    def __init__(self, num_slots: int, max_queue: int, on_change: Callable[[int], None] = lambda n: None) -> None:
        """`on_change` is told the number of open sessions after each change (a gauge)."""
        self.num_slots = num_slots
        self.max_queue = max_queue
        self.num_open = 0
        self._on_change = on_change
        self._session_s = 1.0  # moving average of a session's duration (the retry hint)

    @property
    def capacity(self) -> int:
        return self.num_slots + self.max_queue

    def check(self, num_sessions: int = 1) -> None:
        """Overloaded unless `num_sessions` more may open now."""
        if self.num_open + num_sessions > self.capacity:
            waiting = max(self.num_open - self.num_slots, 0)
            retry = min(max(self._session_s * (waiting + 1) / self.num_slots, 0.05), MAX_RETRY_AFTER_S)
            raise Overloaded(
                f"{self.num_open} sessions are open, the limit is {self.num_slots} slots plus "
                f"{self.max_queue} waiting (--max-queue); retry later",
                retry_after_s=retry,
            )

    @contextmanager
    def admitted(self, num_sessions: int = 1) -> Iterator[None]:
        """Holds `num_sessions` places while the block runs (Overloaded when there are none)."""
        self.check(num_sessions)
        self.num_open += num_sessions
        self._on_change(self.num_open)
        started = time.monotonic()
        try:
            yield
        finally:
            self.num_open -= num_sessions
            self._on_change(self.num_open)
            self._session_s = 0.8 * self._session_s + 0.2 * (time.monotonic() - started)

"""Work too heavy for the event loop that must not starve decoding: tokenizing and
detokenizing megabytes, compiling a grammar.

`OffloadPool` runs it on threads of its own, not asyncio's default pool (which loading a
saved session and rendering chat need too), few of them, and at a lower CPU priority
than the executor: on Linux a thread's nice value is its own (setpriority on its thread
id; raising it needs no privilege), so on a machine with as many cores as the executor
has threads, heavy work gets the CPU the decode leaves, instead of taking it turn about.
At most `max_waiting` calls wait for a thread; more are `Overloaded` with a retry hint
from how long recent calls took. Thread-safe; `submit` never blocks.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from ..domain.errors import Overloaded

log = structlog.get_logger("llmserve.offload")

T = TypeVar("T")


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by `nice` (Linux: per thread); elsewhere nothing."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError):
        pass


class OffloadPool:
    def __init__(self, name: str, num_threads: int, max_waiting: int, nice: int = 10) -> None:
        """`name`: the threads' name prefix and what an Overloaded message calls the work."""
        self.name = name
        self.num_threads = num_threads
        self.max_waiting = max_waiting
        self._nice = nice
        self._lock = threading.Condition()
        self._queue: list[tuple[int, int, _Job]] = []  # a heap: the smallest job first, then FIFO
        self._num_submitted = 0
        self._num_pending = 0  # waiting or running
        self._mean_s = 0.5  # moving average of one call's run time (the retry hint)
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"llmserve-{name}-{i}", daemon=True)
                         for i in range(num_threads)]
        for thread in self._threads:
            thread.start()

    @property
    def num_pending(self) -> int:
        return self._num_pending

    def submit(self, fn: Callable[..., T], *args: Any, may_refuse: bool = True, size: int = 0) -> Future[T]:
        """Run `fn(*args)` on the pool. With `may_refuse`, Overloaded when `max_waiting`
        calls wait already (work that is part of an admitted session passes `False`: it
        waits its turn). `size` (bytes, characters, items: any measure of the work) orders
        the queue, smallest first, so one client's large jobs never hold up a small one
        for longer than the jobs already running. Cancelling the future before it starts
        drops the call."""
        future: Future[T] = Future()
        with self._lock:
            waiting = self._num_pending - self.num_threads
            if may_refuse and waiting >= self.max_waiting:
                retry = min(max(self._mean_s * (waiting + 1) / self.num_threads, 0.1), 30.0)
                raise Overloaded(
                    f"{self._num_pending} {self.name} calls are running or waiting, the limit is "
                    f"{self.num_threads} running plus {self.max_waiting} waiting; retry later",
                    retry_after_s=round(retry, 1),
                )
            if self._closed:
                raise Overloaded(f"the {self.name} pool is shut down", retry_after_s=1.0)
            self._num_pending += 1
            self._num_submitted += 1
            heapq.heappush(self._queue, (size, self._num_submitted, _Job(future, fn, args)))
            self._lock.notify()
        future.add_done_callback(self._done)
        return future

    def _work(self) -> None:
        lower_thread_priority(self._nice)
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._queue)[2]
            if job.future.set_running_or_notify_cancel():  # False: cancelled while it waited
                self._run(job)

    def _run(self, job: _Job) -> None:
        started = time.monotonic()
        try:
            job.future.set_result(job.fn(*job.args))
        except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
            job.future.set_exception(exc)
        finally:
            with self._lock:
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.monotonic() - started)

    def _done(self, _future: Future[Any]) -> None:
        with self._lock:
            self._num_pending -= 1

    def close(self) -> None:
        """Drop what has not started; let what runs finish."""
        with self._lock:
            self._closed = True
            queued, self._queue = self._queue, []
            self._lock.notify_all()
        for _, _, job in queued:
            job.future.cancel()


@dataclass(frozen=True)
class _Job:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]

"""One-shot calls cut before their first response are tried again: the narrow case
gRPC's retry policy (`service_config.json`) cannot see.

When a replica behind Envoy dies (SIGKILL, OOM) after it sent a stream's response
headers, Envoy resets the caller's stream with HTTP/2 INTERNAL_ERROR, which gRPC reports
as INTERNAL "Received RST_STREAM with error code 2". If no response message had arrived,
the caller has nothing of the call, so it counts as not started: the SDK makes it
again, at most `RESET_ATTEMPTS` attempts in all, within the call's deadline. Nothing
else is retried here: not another INTERNAL (a server bug), not a stream that has
delivered a message (its reply was cut mid-way: the caller sees the INTERNAL, see
docs/reliability.md), not a session's turns, not Embed (its inputs are read once).
`retries=False` turns this off with the service config's policy.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import TypeVar

import grpc

RESET_DETAIL = "Received RST_STREAM with error code 2"  # HTTP/2 INTERNAL_ERROR from a proxy
RESET_ATTEMPTS = 3
RESET_BACKOFF_S = 0.1  # the n-th retry waits up to n times this (jittered): Envoy picks another replica anyway

T = TypeVar("T")


def cut_before_reply(err: grpc.RpcError, responses_seen: int) -> bool:
    """The call's stream was reset by a proxy before any response message arrived."""
    code = err.code() if hasattr(err, "code") else None  # type: ignore[attr-defined]
    details = (err.details() if hasattr(err, "details") else "") or ""  # type: ignore[attr-defined]
    return responses_seen == 0 and code == grpc.StatusCode.INTERNAL and RESET_DETAIL in details


class ResetRetry:
    """The attempts of one call: each gets what is left of the call's `timeout`."""

    def __init__(self, enabled: bool, timeout: float | None) -> None:
        self.enabled = enabled
        self.attempts = 0
        self._deadline = time.monotonic() + timeout if timeout is not None else None

    def timeout(self) -> float | None:
        """The next attempt's timeout (what is left of the call's); counts the attempt."""
        self.attempts += 1
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def again(self, err: grpc.RpcError, responses_seen: int) -> float | None:
        """Seconds to wait before the next attempt, or None: the error stands."""
        if not self.enabled or self.attempts >= RESET_ATTEMPTS or not cut_before_reply(err, responses_seen):
            return None
        pause = random.uniform(0.5, 1.0) * RESET_BACKOFF_S * self.attempts
        if self._deadline is not None and time.monotonic() + pause >= self._deadline:
            return None
        return pause


def retried(start: Callable[[float | None], Iterable[T]], retry: ResetRetry) -> Iterator[T]:
    """The responses of `start(timeout)`, started again while `retry.again` says so."""
    while True:
        seen = 0
        try:
            for response in start(retry.timeout()):
                seen += 1
                yield response
            return
        except grpc.RpcError as err:
            pause = retry.again(err, seen)
            if pause is None:
                raise
        time.sleep(pause)


async def retried_async(start: Callable[[float | None], AsyncIterable[T]], retry: ResetRetry) -> AsyncIterator[T]:
    """`retried` for grpc.aio calls."""
    while True:
        seen = 0
        try:
            async for response in start(retry.timeout()):
                seen += 1
                yield response
            return
        except grpc.RpcError as err:
            pause = retry.again(err, seen)
            if pause is None:
                raise
        await asyncio.sleep(pause)

"""One turn of a session stream as the sync and asyncio sessions follow it: its turn
ends (one per sample), and its own time limit.

A session is one Generate stream, and a gRPC deadline covers the whole stream, so a
turn's limit is kept here instead: when it passes, the turn is cancelled in band (the
server ends it CANCELLED and the session, with its KV, stays) and the caller gets
DeadlineExceeded. Should the turn still not end `CANCEL_GRACE_S` later, the stream
itself is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from llmserve.v1 import llmserve_pb2 as pb

from .errors import LLMServeError, error, from_rpc_error

CANCEL_GRACE_S = 5.0


class TurnTracker:
    def __init__(self, samples: int, seconds: float | None) -> None:
        self.samples = samples
        self.seconds = seconds
        self.ends: list[pb.TurnEnd] = []
        self.turn_end: pb.TurnEnd | None = None  # sample 0's
        self.expired = False

    def ended(self, response: pb.GenerateResponse) -> bool:
        """Count a response; True once every sample's turn has ended."""
        if response.HasField("turn_end"):
            self.ends.append(response.turn_end)
            if response.turn_end.index == 0:
                self.turn_end = response.turn_end
        return len(self.ends) >= self.samples

    def expire(self, cancel: Callable[[], object]) -> None:
        """The time limit passed: cancel the turn in band."""
        self.expired = True
        cancel()

    def timed_out(self) -> bool:
        """The limit passed and the turn ended for it (not on its own just before)."""
        return self.expired and any(e.finish_reason == pb.FINISH_REASON_CANCELLED for e in self.ends)

    def error(self, err: grpc.RpcError | None) -> LLMServeError:
        """What to raise: DeadlineExceeded for a turn past its limit, else the call's error."""
        if self.expired or err is None:
            return error(grpc.StatusCode.DEADLINE_EXCEEDED, f"the turn ran past its {self.seconds:g} s limit")
        return from_rpc_error(err)

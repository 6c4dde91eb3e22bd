"""Error types that carry the gRPC status and its google.rpc details.

Every error the client raises is an `LLMServeError`, which is also a `grpc.RpcError`
(so `code()`, `details()` and `trailing_metadata()` work as usual); the subclass
names the status. The rich status (`grpc-status-details-bin`) is read with
grpcio-status's `rpc_status.from_call`: `status` is the google.rpc.Status, `field` /
`field_violations` come from its BadRequest, `retry_after_s` from its RetryInfo.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


class LLMServeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, message: str, metadata: Any = ()) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        self._metadata = tuple(metadata or ())
        self.status: status_pb2.Status | None = None
        self.field_violations: tuple[tuple[str, str], ...] = ()  # (field, description), BadRequest's order
        self.field: str | None = None  # the first violation's field
        self.retry_after_s: float | None = None
        try:
            self.status = rpc_status.from_call(self)  # type: ignore[arg-type]
        except ValueError:  # details that contradict the status line: ignored, as gRPC would
            self.status = None
        for detail in self.status.details if self.status is not None else ():
            bad, retry = error_details_pb2.BadRequest(), error_details_pb2.RetryInfo()
            if detail.Unpack(bad):
                self.field_violations += tuple((v.field, v.description) for v in bad.field_violations)
            elif detail.Unpack(retry):
                self.retry_after_s = retry.retry_delay.ToMilliseconds() / 1000.0
        if self.field_violations:
            self.field = self.field_violations[0][0]

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    def __str__(self) -> str:
        return f"{self._code.name}: {self._message}"


class InvalidArgument(LLMServeError): ...
class ResourceExhausted(LLMServeError): ...
class Unavailable(LLMServeError): ...
class DeadlineExceeded(LLMServeError): ...
class Cancelled(LLMServeError): ...
class FailedPrecondition(LLMServeError): ...
class Unauthenticated(LLMServeError): ...


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def from_rpc_error(err: grpc.RpcError) -> LLMServeError:
    """The typed error for a failed call (sync or asyncio)."""
    if isinstance(err, LLMServeError):
        return err
    code = err.code()  # type: ignore[attr-defined]
    metadata = err.trailing_metadata() if hasattr(err, "trailing_metadata") else ()  # type: ignore[attr-defined]
    return _BY_CODE.get(code, LLMServeError)(code, err.details() or "", metadata)  # type: ignore[attr-defined]


def error(code: grpc.StatusCode, message: str) -> LLMServeError:
    """A typed error made on the client's side (no server status behind it)."""
    return _BY_CODE.get(code, LLMServeError)(code, message)

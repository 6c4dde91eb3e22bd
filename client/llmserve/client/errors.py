"""Error types that carry the gRPC status and its google.rpc details.

Every error the client raises is an `LLMServeError`, which is also a `grpc.RpcError`
(so `code()`, `details()` and `trailing_metadata()` work as usual); the subclass
names the status, and `field` / `retry_after_s` come from BadRequest / RetryInfo.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2


class LLMServeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, message: str, metadata: Any = ()) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        self._metadata = tuple(metadata or ())
        self.field: str | None = None
        self.retry_after_s: float | None = None
        for key, value in self._metadata:
            if key == "grpc-status-details-bin":
                self._read_details(value)

    def _read_details(self, blob: bytes) -> None:
        status = status_pb2.Status.FromString(blob)
        for detail in status.details:
            bad, retry = error_details_pb2.BadRequest(), error_details_pb2.RetryInfo()
            if detail.Unpack(bad) and bad.field_violations:
                self.field = bad.field_violations[0].field
            elif detail.Unpack(retry):
                self.retry_after_s = retry.retry_delay.ToMilliseconds() / 1000.0

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

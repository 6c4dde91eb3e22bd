"""Every gRPC status the service returns is decided here.

Handlers raise `ServiceError` subclasses (or the engine's `InvalidRequest`,
`PreconditionFailed`, `StorageFault` and `Overloaded`, its fields spelled as the request
names them: `FIELD_NAMES`); `rpc_errors` turns them into a status
with google.rpc details (BadRequest field violations, PreconditionFailure naming what in
the environment failed, RetryInfo, and for RESOURCE_EXHAUSTED and UNAVAILABLE
the `grpc-retry-pushback-ms` trailer that gRPC retry policies honour), and turns any other exception into
INTERNAL, logged with its traceback: INTERNAL means a bug. A request message that
did not parse reaches the handler as `Undecodable` (see registration.py) and becomes
INVALID_ARGUMENT where it is read (`check_decoded`). `call_status` names the status a
finished call ended with, for every count and span of it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..domain.errors import (
    FailureKind,
    Field,
    InvalidRequest,
    Overloaded,
    PreconditionFailed,
    StorageFault,
    spelled,
)

log = structlog.get_logger("llmserve.errors")


MAX_MESSAGE_BYTES = 1024  # a status travels in trailers: gRPC clients refuse metadata over 8-16 KiB


def bounded(message: str) -> str:
    """`message` cut to MAX_MESSAGE_BYTES of UTF-8 (a client's value echoed in it can be any
    length; percent-encoded in grpc-message and again in the details it stays under 8 KiB)."""
    raw = message.encode("utf-8", "replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return message
    return raw[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore") + "..."


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL

    def __init__(
        self, message: str, *, field: str | None = None, retry_after_s: float | None = None,
        violation: tuple[str, str] | None = None,
    ):
        """`violation`: (type, subject) of a PreconditionFailure detail (what in the server's
        environment is not as it must be, e.g. ("SESSION_DIR", its path))."""
        self.message = message = bounded(message)
        super().__init__(message)
        self.field = field
        self.retry_after_s = retry_after_s
        self.violation = violation

    def to_status(self) -> grpc.Status:
        details = []
        if self.violation is not None:
            kind, subject = self.violation
            failure = error_details_pb2.PreconditionFailure(
                violations=[error_details_pb2.PreconditionFailure.Violation(
                    type=kind, subject=subject, description=self.message)]
            )
            details.append(_pack(failure))
        if self.field is not None:
            bad = error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=self.field, description=self.message)
                ]
            )
            details.append(_pack(bad))
        if self.retry_after_s is not None:
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(int(self.retry_after_s * 1000))
            details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        status = rpc_status.to_status(
            status_pb2.Status(code=getattr(code_pb2, self.code.name), message=self.message, details=details)
        )
        if self.retry_after_s is None or self.code not in _RETRYABLE:
            return status
        # gRPC retry policies read grpc-retry-pushback-ms (gRFC A6); Envoy's retry reset
        # headers take whole seconds (`retry-after`, as HTTP has it).
        pushback = (
            ("grpc-retry-pushback-ms", str(int(self.retry_after_s * 1000))),
            ("retry-after", str(max(1, math.ceil(self.retry_after_s)))),
        )
        return _Status(status.code, status.details, tuple(status.trailing_metadata) + pushback)


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):  # type: ignore[misc]
    pass


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Internal(ServiceError):
    code = grpc.StatusCode.INTERNAL


_RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)

# The engine's words, as gRPC says them: a session's failure, and the fields it names.
_OF_FAILURE = {
    FailureKind.INVALID: InvalidArgument,
    FailureKind.DEADLINE: DeadlineExceeded,
    FailureKind.SHUTDOWN: Unavailable,
    FailureKind.BUSY: ResourceExhausted,
    FailureKind.INTERNAL: Internal,
}
FIELD_NAMES = {
    Field.INPUT: "input",
    Field.END_OF_TURN: "end_of_turn",
    Field.MESSAGES: "input.messages",
    Field.MAX_TOKENS: "config.stopping.max_tokens",
    Field.SESSION_ID: "config.session_id",
    Field.ADAPTER: "config.adapter",
}


def from_domain(error: InvalidRequest | Overloaded) -> ServiceError:
    """The engine's refusals, as statuses. A failing environment (StorageFault) is
    FAILED_PRECONDITION with a PreconditionFailure naming it: not the request's fault
    (no BadRequest), not a bug (not INTERNAL)."""
    if isinstance(error, Overloaded):
        return ResourceExhausted(str(error), retry_after_s=error.retry_after_s)
    if isinstance(error, StorageFault):
        return FailedPrecondition(str(error), retry_after_s=error.retry_after_s, violation=("SESSION_DIR", error.path))
    cls = FailedPrecondition if isinstance(error, PreconditionFailed) else InvalidArgument
    return cls(str(error), field=spelled(error.field, FIELD_NAMES), retry_after_s=error.retry_after_s)


def _as_status(error: ServiceError | InvalidRequest | Overloaded) -> ServiceError:
    return error if isinstance(error, ServiceError) else from_domain(error)


@dataclass(frozen=True)
class Undecodable:
    """A request message whose bytes did not parse."""

    type_name: str
    error: str


def check_decoded(message: Any) -> Any:
    if isinstance(message, Undecodable):
        raise InvalidArgument(f"the {message.type_name} message does not parse: {message.error}")
    return message


def error_from_failure(kind: FailureKind, message: str) -> ServiceError:
    """A session the executor ended (`SessionFailed`), as its status."""
    return _OF_FAILURE[kind](message)


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


async def _abort(context: grpc.aio.ServicerContext, error: ServiceError) -> None:
    await context.abort_with_status(error.to_status())


def _bug(method: str, exc: BaseException) -> Internal:
    log.error("rpc_internal_error", method=method, exc_info=exc)
    return Internal(f"internal error: {type(exc).__name__}")


def call_status(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    """The name of the gRPC status a call ends with ("OK", "CANCELLED", ...) when its
    handler ended by raising `error` (None: it returned).

    The one rule for a finished call: `rpc_errors` counts it by this
    (`llmserve_requests_total`), and so do the per-RPC metrics (rpc_metrics.py) and the
    server span (tracing.py), each with what reached it, so the three agree:

    - returned: the code the handler set (`context.set_code`), else OK;
    - aborted (`grpc.aio.AbortError`): the code it aborted with, read from the context;
    - stopped by grpc (`asyncio.CancelledError`, or `GeneratorExit` when grpc stops
      reading a response stream): DEADLINE_EXCEEDED when no time remains (grpc's own
      deadline), else CANCELLED (the client cancelled or went away);
    - a `ServiceError` or an engine refusal: the code `rpc_errors` aborts with;
    - any other exception: `rpc_errors` never lets one out (it aborts with INTERNAL
      instead); from a handler without it (health, reflection) grpc sends UNKNOWN.
    """
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    if isinstance(error, (ServiceError, InvalidRequest, Overloaded)):
        return _as_status(error).code.name
    if error is None or isinstance(error, grpc.aio.AbortError):
        code = context.code()  # None until set; a grpc.StatusCode after set_code or an abort
        if code is not None:
            return code.name
        return "OK" if error is None else "UNKNOWN"
    return "UNKNOWN"


def _to_abort(method: str, error: BaseException) -> ServiceError | None:
    """The status a handler's exception aborts the call with: a refusal's own, INTERNAL
    (logged) for a bug; None for an abort, a cancel or a closed stream (they go on up)."""
    if isinstance(error, (ServiceError, InvalidRequest, Overloaded)):
        return _as_status(error)
    if isinstance(error, Exception) and not isinstance(error, grpc.aio.AbortError):
        return _bug(method, error)
    return None


def rpc_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a servicer method (coroutine or async generator) with the status mapping.

    Also counts every finished call by method and status (`self.metrics.requests`).
    """
    name = method.__name__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
            error: BaseException | None = None
            try:
                async for response in method(self, request, context):
                    yield response
            except BaseException as exc:
                status = _to_abort(name, exc)
                error = status or exc
                if status is None:
                    raise
                await _abort(context, status)
            finally:
                self.metrics.requests.labels(name, call_status(context, error)).inc()
                error = None  # no cycle through its traceback to this frame

        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        error: BaseException | None = None
        try:
            return await method(self, check_decoded(request), context)
        except BaseException as exc:
            status = _to_abort(name, exc)
            error = status or exc
            if status is None:
                raise
            await _abort(context, status)
        finally:
            self.metrics.requests.labels(name, call_status(context, error)).inc()
            error = None  # no cycle through its traceback to this frame

    return unary_wrapper

"""Every HTTP error the OpenAI wing returns is decided here, in OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`.

| cause | status | type |
|---|---|---|
| the engine's `InvalidRequest` / `PreconditionFailed`, a field we do not serve | 400 | invalid_request_error |
| missing or wrong `Authorization: Bearer` (`--api-key`) | 401 | authentication_error |
| unknown `model` | 404 | invalid_request_error, code model_not_found |
| body over `--max-message-bytes` | 413 | invalid_request_error |
| a body whose `Content-Encoding` does not decode (aiohttp's `HttpProcessingError`) | 400 | invalid_request_error |
| `Overloaded`, sessions over slots + `--max-queue` (with Retry-After) | 429 | rate_limit_error |
| the model is loading, the server drains | 503 | service_unavailable |
| a session the executor ended with DEADLINE_EXCEEDED | 408 | timeout |
| anything else: a bug, logged with its traceback | 500 | server_error |

`param` is the request's own field name (`temperature`, `messages[2].content`): the
engine names fields as the gRPC request does (`config.sampling.temperature`,
`input.messages[2]`), and `param_of` translates.
"""

from __future__ import annotations

import math

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ..domain.errors import InvalidRequest
from ..engine.engine import Overloaded

# A SessionFailed's status (a gRPC status name, as the executor reports it) → HTTP.
_STATUS_OF_NAME = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "OUT_OF_RANGE": (400, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (408, "timeout"),
}
_PREFIXES = ("config.sampling.", "config.stopping.", "config.output.", "config.")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def unavailable(message: str, retry_after_s: float | None = None) -> ApiError:
    return ApiError(503, message, "service_unavailable", retry_after_s=retry_after_s)


def param_of(field: str | None) -> str | None:
    """The engine's (gRPC-named) field as this request names it."""
    if field is None:
        return None
    if field.startswith("input.messages"):
        return "messages" + field[len("input.messages"):]
    if field in ("input", "end_of_turn"):
        return "messages"
    for prefix in _PREFIXES:
        if field.startswith(prefix):
            return field[len(prefix):]
    return field


def from_exception(exc: BaseException) -> ApiError | None:
    """The engine's refusals as API errors; None for anything else (a bug: 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):  # PreconditionFailed and GrammarError too
        error = bad_request(str(exc), param_of(exc.field))
        error.retry_after_s = exc.retry_after_s
        return error
    if isinstance(exc, (HttpProcessingError, RequestPayloadError)):  # a body aiohttp cannot read
        reason = " ".join(str(exc).split())
        param = "Content-Encoding" if "content-encoding" in reason.lower() else None
        return ApiError(400, f"the body cannot be read: {reason}", param=param)
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), "rate_limit_error", retry_after_s=exc.retry_after_s)
    return None


def from_status_name(status: str, message: str) -> ApiError:
    """A session the executor ended (`SessionFailed`)."""
    code, kind = _STATUS_OF_NAME.get(status, (500, "server_error"))
    return ApiError(code, message, kind, retry_after_s=1.0 if code in (429, 503) else None)


def server_error() -> ApiError:
    return ApiError(500, "internal server error (logged)", "server_error")

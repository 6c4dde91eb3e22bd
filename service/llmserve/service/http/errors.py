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
| a session the executor ended: invalid / deadline / shutting down | 400 / 408 / 503 | (`_OF_FAILURE`) |
| anything else: a bug, logged with its traceback | 500 | server_error |

`param` is the request's own field name (`temperature`, `messages[2].content`): the shared
rules take this wing's names, and the fields the engine names itself (`Field`) are
spelled here once (`FIELD_NAMES`).
"""

from __future__ import annotations

import math

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ..domain.errors import FailureKind, Field, InvalidRequest, Overloaded, spelled

# The engine's words, as this API says them: a session's failure, and the fields it names
# (a turn's input is the body's messages; /v1/completions names its prompt instead).
_OF_FAILURE = {
    FailureKind.INVALID: (400, "invalid_request_error"),
    FailureKind.DEADLINE: (408, "timeout"),
    FailureKind.SHUTDOWN: (503, "service_unavailable"),
    FailureKind.BUSY: (503, "service_unavailable"),
    FailureKind.INTERNAL: (500, "server_error"),
}
FIELD_NAMES = {
    Field.INPUT: "messages",
    Field.END_OF_TURN: "messages",
    Field.MESSAGES: "messages",
    Field.MAX_TOKENS: "max_tokens",
    Field.SESSION_ID: "session_id",
    Field.ADAPTER: "lora",
}


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


def from_exception(exc: BaseException) -> ApiError | None:
    """The engine's refusals as API errors; None for anything else (a bug: 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):  # PreconditionFailed and GrammarError too
        error = bad_request(str(exc), spelled(exc.field, FIELD_NAMES))
        error.retry_after_s = exc.retry_after_s
        return error
    if isinstance(exc, (HttpProcessingError, RequestPayloadError)):  # a body aiohttp cannot read
        reason = " ".join(str(exc).split())
        param = "Content-Encoding" if "content-encoding" in reason.lower() else None
        return ApiError(400, f"the body cannot be read: {reason}", param=param)
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), "rate_limit_error", retry_after_s=exc.retry_after_s)
    return None


def from_failure(failure: FailureKind, message: str) -> ApiError:
    """A session the executor ended (`SessionFailed`)."""
    code, kind = _OF_FAILURE[failure]
    return ApiError(code, message, kind, retry_after_s=1.0 if code == 503 else None)


def server_error() -> ApiError:
    return ApiError(500, "internal server error (logged)", "server_error")

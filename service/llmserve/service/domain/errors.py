"""The engine's refusals: a request it will not serve, and why (the transport maps them to statuses)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the engine refuses (the transport maps it to INVALID_ARGUMENT)."""

    def __init__(self, message: str, field: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.retry_after_s = retry_after_s


class PreconditionFailed(InvalidRequest):
    """A request this server cannot serve as configured (FAILED_PRECONDITION)."""


class GrammarError(InvalidRequest):
    """A GBNF grammar (or the grammar of a JSON schema) that llama.cpp cannot use."""

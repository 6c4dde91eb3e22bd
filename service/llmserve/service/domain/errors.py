"""The engine's refusals and failures in its own words; each surface says them in its own
(transport/errors.py as gRPC statuses, http/errors.py as OpenAI's error objects).

- `InvalidRequest` (and `PreconditionFailed`, `GrammarError`, `StorageFault`) refuse a
  request, naming the field: a `Field` (or a place inside one, `FieldPath`) when the
  engine names it, a string when a surface already spelled it (the shared rules take each
  surface's names: domain/request_rules.py).
- `Overloaded`: valid work the server is too busy to take now.
- `FailureKind`: why the executor ended a session (`SessionFailed`, domain/events.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Field(enum.Enum):
    """A request field as the engine names it; each surface maps it to its own name once."""

    INPUT = "input"  # a turn's input as a whole (text, token ids or messages)
    END_OF_TURN = "end_of_turn"  # the part of a request that ends a turn
    MESSAGES = "messages"  # a chat session's messages
    MAX_TOKENS = "max_tokens"  # the turn's limit of generated tokens
    SESSION_ID = "session_id"  # a named session's id
    ADAPTER = "adapter"  # the LoRA adapters a session decodes under

    def at(self, index: int, below: str = "") -> FieldPath:
        """A place inside a list field: `Field.MESSAGES.at(2, "role")` is the third message's role."""
        return FieldPath(self, f"[{index}]" + (f".{below}" if below else ""))


@dataclass(frozen=True)
class FieldPath:
    """A place inside a field: `below` follows the surface's name as it is ("[2].role")."""

    field: Field
    below: str


FieldRef = str | Field | FieldPath  # a str: a surface's own name already


def spelled(field: FieldRef | None, names: Mapping[Field, str]) -> str | None:
    """`field` as a surface names it (`names`: its name of each engine field)."""
    if isinstance(field, Field):
        return names[field]
    if isinstance(field, FieldPath):
        return names[field.field] + field.below
    return field


class FailureKind(enum.Enum):
    """Why the executor ended a session."""

    INVALID = enum.auto()  # the request's input cannot be served
    DEADLINE = enum.auto()  # the call's deadline passed, or its reader stopped reading
    SHUTDOWN = enum.auto()  # the server is shutting down: retry elsewhere
    BUSY = enum.auto()  # no room for it now (every resident LoRA adapter in use): retry shortly
    INTERNAL = enum.auto()  # a bug (logged)


class InvalidRequest(ValueError):
    """A request the engine refuses: the request's fault."""

    def __init__(self, message: str, field: FieldRef | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.retry_after_s = retry_after_s


class PreconditionFailed(InvalidRequest):
    """A request this server cannot serve as configured (or not now: see `retry_after_s`)."""


class GrammarError(InvalidRequest):
    """A GBNF grammar (or the grammar of a JSON schema) that llama.cpp cannot use."""


class StorageFault(PreconditionFailed):
    """The server's storage (`--session-dir`) fails: the environment's fault, not the
    request's and not a bug. `path` names what failed."""

    def __init__(self, message: str, path: str, retry_after_s: float | None = None) -> None:
        super().__init__(message, None, retry_after_s)
        self.path = path


class Overloaded(Exception):
    """Valid work the server is too busy to take now (with a retry hint): never blamed on
    the request."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

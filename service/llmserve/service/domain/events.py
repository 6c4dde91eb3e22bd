"""What the executor sends back to a request's sink: tokens, turn ends, failures, embedding results."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .errors import FailureKind


class EventSink(Protocol):
    """Where a request's events go (the transport bridges it into the event loop)."""

    def put(self, event: object) -> None: ...

    @property
    def backlog(self) -> int:
        """Events put but not yet taken by the consumer."""
        ...


class FinishReason(enum.IntEnum):
    """Why a turn ended (numbers match llmserve.v1.FinishReason)."""

    UNSPECIFIED = 0
    STOP = 1
    LENGTH = 2
    STOP_SEQUENCE = 3
    CANCELLED = 4
    DEADLINE = 5
    CONTEXT_FULL = 6
    ERROR = 7
    TOOL_CALLS = 8  # the reply is tool calls


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (id, text, logprob), most likely first


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: `arguments` is JSON text, as OpenAI's API carries it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call as it forms: its head (id and name) first, then argument fragments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class TokenEvent:
    """Text that is safe to show (complete UTF-8, no stop string) and its tokens. With
    tools the session's handle rewrites it: `text` is the answer's, `tool_calls` the calls
    as they form."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    index: int = 0
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class PromptLogprobsEvent:
    tokens: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class TurnEndEvent:
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_ms: float
    ttft_ms: float
    prompt_ms: float
    decode_ms: float
    seed: int
    matched_stop: str = ""
    message: str = ""
    index: int = 0
    matched_stop_token_id: int | None = None
    final: bool = True  # the last turn end of this turn (all samples done)
    draft_tokens: int = 0  # speculative draft tokens verified
    accepted_draft_tokens: int = 0
    tool_calls: tuple[ToolCall, ...] = ()  # with tools: the reply's calls (finish_reason TOOL_CALLS)
    # When the phases ran (time.monotonic() seconds), for trace spans: waiting for a slot
    # [t_queued, t_slot], prefill [t_ready, t_first_token], decode [t_first_token, t_end].
    t_queued: float = 0.0
    t_slot: float = 0.0
    t_ready: float = 0.0
    t_first_token: float = 0.0
    t_end: float = 0.0


@dataclass(frozen=True)
class SessionFailed:
    """The session cannot go on; its surface ends the call (each maps `kind` once:
    transport/errors.py, http/errors.py)."""

    kind: FailureKind
    message: str


@dataclass(frozen=True)
class EmbedResult:
    index: int
    vector: np.ndarray
    num_tokens: int
    truncated: bool
    # The executor step that computed it (time.monotonic() seconds; inputs of all calls).
    t_batch_start: float = 0.0
    t_batch_end: float = 0.0
    batch_size: int = 0

"""Domain types shared by the transport and the executor.

Everything here is a frozen dataclass or an enum: these values cross from the
event-loop thread to the executor thread and back, so nobody may mutate them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


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


@dataclass(frozen=True)
class SamplingParams:
    """Resolved sampling parameters (defaults follow llama-server)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class StoppingParams:
    """When a turn stops: max_tokens None means "until the slot's context is full"."""

    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class SessionParams:
    """Everything the first Generate message configures."""

    request_id: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    priority: int = 0


# ----------------------------------------------------------- executor → client


@dataclass(frozen=True)
class TokenEvent:
    """Text that is safe to show (complete UTF-8, no stop string) and its tokens."""

    text: str
    token_ids: tuple[int, ...]


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


@dataclass(frozen=True)
class SessionFailed:
    """The session cannot go on; the transport ends the RPC with this status."""

    status: str  # a StatusCode name, e.g. "INVALID_ARGUMENT"
    message: str


@dataclass(frozen=True)
class EmbedInput:
    """One tokenized input of an Embed stream."""

    index: int
    tokens: tuple[int, ...]
    normalize: bool
    truncated: bool


@dataclass(frozen=True)
class EmbedResult:
    index: int
    vector: np.ndarray
    num_tokens: int
    truncated: bool

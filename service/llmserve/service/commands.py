"""Messages that cross into the executor thread, and the snapshot it publishes.

The transport puts commands on the executor's queue; the executor drains the
queue once per step. All frozen: they cross threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from .domain import EmbedInput, SessionParams
from .session import EventSink
from .session_store import SavedSession


@dataclass(frozen=True)
class SlotSnapshot:
    seq_id: int
    busy: bool
    num_cached_tokens: int
    paused: bool = False
    kv_pos_min: int = -1  # from llama.cpp's memory, for leak checks
    kv_pos_max: int = -1


@dataclass(frozen=True)
class ExecutorSnapshot:
    """Published by the executor after every step; read from any thread."""

    slots: tuple[SlotSnapshot, ...] = ()
    num_sessions: int = 0
    num_waiting: int = 0
    num_embed_queued: int = 0
    num_steps: int = 0
    num_kv_tokens: int = 0


@dataclass(frozen=True)
class Open:
    key: int
    params: SessionParams
    sink: EventSink
    deadline: float | None  # time.monotonic() by which the session must end
    restore: SavedSession | None = None  # a saved session to resume


@dataclass(frozen=True)
class AddInput:
    key: int
    tokens: tuple[int, ...]
    end_of_turn: bool
    replace: bool = False  # chat: tokens are the whole rendered history


@dataclass(frozen=True)
class Cancel:
    key: int


@dataclass(frozen=True)
class Close:
    key: int
    chat: tuple[tuple[str, str], ...] | None = None  # the conversation, saved with a named session


@dataclass(frozen=True)
class Embed:
    inputs: tuple[EmbedInput, ...]
    sink: EventSink


@dataclass(frozen=True)
class DropEmbeds:
    """The Embed call is over: forget its inputs that have not run yet."""

    sink: EventSink


STOP = object()  # ends the executor loop

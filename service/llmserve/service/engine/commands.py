"""Messages that cross into the executor thread.

The transport puts commands on the executor's queue; the executor drains the
queue once per step. All frozen: they cross threads (`Open.conversation` is the one
mutable object shared, behind its own lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..domain.events import EventSink
from ..domain.requests import EmbedInput, SessionParams
from ..domain.snapshots import SavedSession
from .chat.chat import Conversation


@dataclass(frozen=True)
class Open:
    key: int
    params: SessionParams
    sink: EventSink
    deadline: float | None  # time.monotonic() by which the session must end
    restore: SavedSession | None = None  # a saved session to resume
    grammar: object | None = None  # params.sampling.grammar compiled (Engine.compile_async)
    conversation: Conversation | None = None  # a chat session's, read when a named session is saved


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


@dataclass(frozen=True)
class Embed:
    inputs: tuple[EmbedInput, ...]
    sink: EventSink


@dataclass(frozen=True)
class DropEmbeds:
    """The Embed call is over: forget its inputs that have not run yet."""

    sink: EventSink


@dataclass(frozen=True)
class LoadAdapter:
    """Load a LoRA adapter file; `done` gets what the runner returns or the exception (on the executor thread)."""

    name: str
    checked: object  # the runner's check of the file (model.adapters.AdapterFile), made off the executor thread
    done: Callable[[object], None]


@dataclass(frozen=True)
class UnloadAdapter:
    """Refuse new sessions under the adapter, free it once none runs under it; `done` gets
    True when it was freed at once, and `freed` is called (executor thread) when it is."""

    name: str
    done: Callable[[object], None]
    freed: Callable[[str], None]


STOP = object()  # ends the executor loop

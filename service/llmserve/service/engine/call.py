"""One surface call's sessions, as every surface runs them: the call core.

A surface opens a `Call` (`Engine.call`), opens its sessions on it (one per gRPC stream,
chat request or completions prompt), hands them input, and reads `events()`: each
session's token, prompt-logprobs and turn-end events, already shown to the session
(`SessionHandle.observe`: the chat reply, tools' answer text and calls), every turn end
recorded (metrics, the `turn_end` log line, tracing), a session the executor ends raised
as `SessionEnded` (each surface spells it its own way, in one place). However the call
ends, its sessions close and a turn the close cancels is still recorded. The surface only
turns requests into input and these events into its wire format; `Usage` is the one
count of a call's tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from ..domain.events import PromptLogprobsEvent, SessionFailed, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..metrics import Metrics
from ..turn_record import record_turn, turn_recorder
from .loop_sink import LoopSink
from .session_handle import SessionHandle

Opener = Callable[[SessionParams, LoopSink], SessionHandle]  # Engine's: one session on a sink


class SessionEnded(Exception):
    """The executor ended one of the call's sessions (`SessionFailed`): `kind` says why."""

    def __init__(self, failure: SessionFailed) -> None:
        super().__init__(failure.message)
        self.kind = failure.kind


class Call:
    """Loop thread only; a context manager (`with engine.call(...) as call`): leaving it
    closes the call. `one_turn`: each session serves one turn (chat, completions): it
    closes at its last sample's turn end, and `events()` ends once every session has;
    else (a gRPC stream) the surface ends the call by leaving `events()`."""

    def __init__(self, sink: LoopSink, params: SessionParams, metrics: Metrics, opener: Opener,
                 one_turn: bool) -> None:
        self.sink = sink
        self._params = params
        self._metrics = metrics
        self._opener = opener
        self._one_turn = one_turn
        self.sessions: list[SessionHandle] = []
        self._open: set[int] = set()

    def open(self) -> SessionHandle:
        """One more session of the call, with the call's parameters; its events carry its
        index in `sessions` as their tag."""
        tag = len(self.sessions)
        self.sessions.append(self._opener(self._params, self.sink.tagged(tag)))
        self._open.add(tag)
        return self.sessions[tag]

    async def events(self) -> AsyncIterator[tuple[int | None, object]]:
        """(session index, event) for each session's events, observed and recorded; (None,
        what the surface put) for its own `sink.put_local` events. SessionEnded when the
        executor ends a session."""
        while self._open or not self._one_turn:
            tag, event = await self.sink.get_tagged()
            if tag is None:
                yield None, event
                continue
            if isinstance(event, SessionFailed):
                raise SessionEnded(event)
            if not isinstance(event, (TokenEvent, PromptLogprobsEvent, TurnEndEvent)):
                continue
            assert isinstance(tag, int)
            for observed in await self.sessions[tag].observe(event):  # with tools: the answer's text and the calls
                if isinstance(observed, TurnEndEvent):
                    record_turn(self._metrics, observed, self._params)
                    if observed.final and self._one_turn:  # its slot serves the next session at once
                        self._close(tag)
                yield tag, observed

    def close(self) -> None:
        """The call is over, however it ended: its open sessions close (their slots free
        before the next executor step); a turn the close cancels is still recorded."""
        self.sink.orphans_to(turn_recorder(self._metrics, self._params))
        for tag in sorted(self._open):
            self._close(tag)

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _close(self, tag: int) -> None:
        self._open.discard(tag)
        self.sessions[tag].close()


@dataclass(frozen=True)
class Usage:
    """A call's tokens: each prompt once (its samples share it), every sample's completion."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, ends: Mapping[int, TurnEndEvent], num_samples: int, completions: bool = True) -> Usage:
        """`ends` by choice (prompt × `num_samples` + sample); `completions` False: a call that
        only scores its prompts generates none."""
        firsts = [end for choice, end in ends.items() if choice % num_samples == 0]
        return cls(sum(end.prompt_tokens for end in firsts), sum(end.cached_tokens for end in firsts),
                   sum(end.completion_tokens for end in ends.values()) if completions else 0)

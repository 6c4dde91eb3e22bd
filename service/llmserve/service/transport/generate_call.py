"""One Generate call: a reader task feeds the executor, the writer streams events out.

The reader validates and tokenizes each message and forwards input, turn ends
and cancels to the executor. The writer turns executor events into responses.
They share a `CallState` on the event-loop thread. The call ends OK once the client
has half-closed and no turn is open; it ends with the executor's status when the
session fails, and with UNAVAILABLE when the server drains between turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog
from llmserve.v1 import llmserve_pb2 as pb

from ..domain import (
    FinishReason,
    PromptLogprobsEvent,
    SavedSession,
    SessionFailed,
    SessionParams,
    TokenEvent,
    TurnEndEvent,
)
from ..engine.chat import MAX_MESSAGES, ChatMessage
from ..engine.engine import Engine, SessionHandle
from ..metrics import Metrics
from .errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
    check_decoded,
    error_from_status_name,
)
from .inputs import input_tokens
from .loop_sink import LoopSink
from .protos import logprob_proto, turn_end_proto
from .turn_record import record_turn

log = structlog.get_logger("llmserve.generate")

MAX_TURNS_PENDING = 2  # the running turn and one queued behind it


@dataclass
class CallState:
    """The transport's view of the call (token counts for limits, chat history)."""

    turns_open: int = 0
    turn_tokens: int = 0
    session_tokens: int = 0
    has_history: bool = False
    needs_bos: bool = True
    draining: bool = False
    chat: list[ChatMessage] | None = None  # the conversation, when the session uses messages
    reply: list[str] = field(default_factory=list)  # sample 0's text of the running turn
    # Chat messages sent while a reply runs: rendered once the reply is in the history.
    deferred_chat: list[tuple[list[ChatMessage], bool]] = field(default_factory=list)

    @property
    def num_turns_pending(self) -> int:
        """Turns open in the engine plus chat turns waiting to be rendered."""
        return self.turns_open + sum(end_of_turn for _, end_of_turn in self.deferred_chat)


class _ClientDone:
    """The client half-closed its side of the stream."""


class Drain:
    """The server is shutting down: end the session once no turn is open."""


class _ReaderFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class GenerateCall:
    def __init__(self, engine: Engine, metrics: Metrics, max_input_tokens: int, restore: SavedSession | None = None,
                 grammar: object | None = None) -> None:
        self.engine = engine
        self.restore = restore
        self.grammar = grammar  # the compiled constraint (Engine.compile_constraint)
        self.metrics = metrics
        self.max_input_tokens = max_input_tokens
        self.sink = LoopSink(asyncio.get_running_loop())
        self.state = CallState()
        self.params: SessionParams | None = None

    async def run(
        self, first: pb.GenerateRequest, params: SessionParams, requests: AsyncIterator[pb.GenerateRequest],
        deadline: float | None,
    ) -> AsyncIterator[pb.GenerateResponse]:
        engine, state = self.engine, self.state
        self.params = params
        add_bos = first.config.add_bos if first.config.HasField("add_bos") else True
        state.needs_bos = add_bos and engine.meta.add_bos
        if self.restore is not None:  # a saved session goes on: its history is in the KV
            state.needs_bos = False
            state.has_history = True
            state.session_tokens = len(self.restore.tokens) + len(self.restore.pending)
            if self.restore.chat is not None:
                state.chat = [ChatMessage(role, content) for role, content in self.restore.chat]
        session = engine.open_session(params, self.sink, deadline, self.restore, self.grammar)
        reader = asyncio.create_task(self._read(first, requests, session))
        client_done = False
        try:
            while True:
                event = await self.sink.get()
                if isinstance(event, TokenEvent):
                    if event.index == 0 and state.chat is not None:
                        state.reply.append(event.text)
                    yield pb.GenerateResponse(
                        request_id=params.request_id,
                        chunk=pb.TokenChunk(
                            text=event.text,
                            token_ids=event.token_ids,
                            logprobs=[logprob_proto(lp) for lp in event.logprobs],
                            index=event.index,
                        ),
                    )
                elif isinstance(event, PromptLogprobsEvent):
                    yield pb.GenerateResponse(
                        request_id=params.request_id,
                        prompt_logprobs=pb.PromptLogprobs(tokens=[logprob_proto(lp) for lp in event.tokens]),
                    )
                elif isinstance(event, TurnEndEvent):
                    if event.final:
                        state.turns_open -= 1
                    if event.index == 0 and state.chat is not None:
                        state.chat.append(ChatMessage("assistant", "".join(state.reply)))
                        state.reply.clear()
                        session.keep_chat(self._chat_to_save())
                    if event.final:
                        await self._run_deferred_chat(session)
                    record_turn(self.metrics, event, params)
                    yield pb.GenerateResponse(request_id=params.request_id, turn_end=turn_end_proto(event))
                    if event.finish_reason == FinishReason.DEADLINE:
                        raise DeadlineExceeded("the call's deadline expired")
                elif isinstance(event, _ClientDone):
                    client_done = True
                elif isinstance(event, Drain):
                    state.draining = True
                elif isinstance(event, SessionFailed):
                    raise error_from_status_name(event.status, event.message)
                elif isinstance(event, _ReaderFailed):
                    raise event.error
                if state.turns_open == 0:
                    if client_done:
                        return
                    if state.draining:
                        raise Unavailable("the server is shutting down")
        finally:
            reader.cancel()
            session.close(self._chat_to_save())

    def _chat_to_save(self) -> tuple[tuple[str, str], ...] | None:
        """The conversation a named session keeps: a reply cut short as far as the client saw
        it; input that was never answered is dropped, so the next stream's messages alternate."""
        state = self.state
        if state.chat is None:
            return None
        messages = list(state.chat)
        if state.turns_open and state.reply:
            messages.append(ChatMessage("assistant", "".join(state.reply)))
        while messages and messages[-1].role != "assistant":
            messages.pop()
        return tuple((m.role, m.content) for m in messages)

    async def _read(
        self, first: pb.GenerateRequest, requests: AsyncIterator[pb.GenerateRequest], session: SessionHandle
    ) -> None:
        try:
            await self._on_message(first, session)
            async for message in requests:
                await self._on_message(message, session)
            if self.state.turn_tokens:  # input without end_of_turn, then half-close: run it
                self._end_turn(session, ())
            self.sink.put_local(_ClientDone())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the writer, which maps it
            self.sink.put_local(_ReaderFailed(exc))

    async def _on_message(self, message: pb.GenerateRequest, session: SessionHandle) -> None:
        message = check_decoded(message)
        engine, state = self.engine, self.state
        if message.cancel:
            session.cancel()
        tokens: tuple[int, ...] = ()
        if message.HasField("input") and message.input.WhichOneof("kind") == "messages":
            messages = self._chat_messages(message.input.messages)
            if message.end_of_turn and state.num_turns_pending >= MAX_TURNS_PENDING:
                raise self._turn_queue_full()
            if state.turns_open or state.deferred_chat:
                state.deferred_chat.append((messages, message.end_of_turn))
            else:
                await self._chat_turn(messages, message.end_of_turn, session)
            return
        if message.HasField("input"):
            if state.chat is not None:
                raise InvalidArgument("a session that uses chat messages must keep to messages", field="input")
            tokens = await input_tokens(engine, message.input, "input", state.needs_bos)
            state.needs_bos = False
            state.turn_tokens += len(tokens)
            state.session_tokens += len(tokens)
            self._check_sizes()
        if message.end_of_turn:
            self._end_turn(session, tokens)
        elif tokens:
            session.add_input(tokens, False)

    def _check_sizes(self) -> None:
        engine, state = self.engine, self.state
        if state.turn_tokens > engine.limits.n_ctx_per_slot:
            raise InvalidArgument(
                f"the turn's input has {state.turn_tokens} tokens, more than the per-slot context "
                f"of {engine.limits.n_ctx_per_slot}",
                field="input",
            )
        if state.session_tokens > self.max_input_tokens:
            raise InvalidArgument(
                f"the session's input reached {state.session_tokens} tokens, more than the limit "
                f"of {self.max_input_tokens} (--max-input-tokens)",
                field="input",
            )

    async def _chat_turn(self, messages: list[ChatMessage], end_of_turn: bool, session: SessionHandle) -> None:
        """Add the messages to the conversation and send the whole rendering as the turn's input
        (the KV reuses its prefix, so only the new tokens are prefilled)."""
        state = self.state
        assert state.chat is not None
        state.chat.extend(messages)
        session.keep_chat(self._chat_to_save())  # a chat session, even if the engine ends it first
        tokens = await asyncio.to_thread(self.engine.render_chat, list(state.chat))
        state.turn_tokens = state.session_tokens = len(tokens)
        self._check_sizes()
        if end_of_turn:
            self._end_turn(session, tokens, replace=True)
        else:
            session.add_input(tokens, False, replace=True)

    async def _run_deferred_chat(self, session: SessionHandle) -> None:
        state = self.state
        while state.deferred_chat and not state.turns_open:
            messages, end_of_turn = state.deferred_chat.pop(0)
            await self._chat_turn(messages, end_of_turn, session)

    def _turn_queue_full(self) -> FailedPrecondition:
        return FailedPrecondition(
            "a turn is already queued behind the running one: wait for its turn_end before the next end_of_turn",
            field="end_of_turn",
        )

    def _chat_messages(self, msg: pb.ChatMessages) -> list[ChatMessage]:
        engine, state = self.engine, self.state
        if engine.chat_template is None:
            raise FailedPrecondition(
                "the model has no chat template (tokenizer.chat_template); start the server with "
                "--chat-template-file, or send text or token ids"
            )
        if state.chat is None:
            if state.has_history or state.turn_tokens:
                raise InvalidArgument("a session that started with text or tokens cannot switch to messages", field="input")
            state.chat = []
        if not msg.messages:
            raise InvalidArgument("messages must not be empty", field="input.messages")
        num_deferred = sum(len(messages) for messages, _ in state.deferred_chat)
        if len(state.chat) + num_deferred + len(msg.messages) > MAX_MESSAGES:
            raise InvalidArgument(f"a session holds at most {MAX_MESSAGES} messages", field="input.messages")
        for i, m in enumerate(msg.messages):
            if not m.role:
                raise InvalidArgument("every message needs a role", field=f"input.messages[{i}].role")
        return [ChatMessage(m.role, m.content) for m in msg.messages]

    def _end_turn(self, session: SessionHandle, tokens: tuple[int, ...], replace: bool = False) -> None:
        state, limits = self.state, self.engine.limits
        if state.turn_tokens == 0 and not state.has_history:
            raise InvalidArgument("the turn has no input: send text or token ids", field="input")
        if state.num_turns_pending >= MAX_TURNS_PENDING:
            raise self._turn_queue_full()
        max_tokens = self.params.stopping.max_tokens if self.params else None
        if not state.has_history and max_tokens and not limits.context_shift:
            if state.turn_tokens + max_tokens > limits.n_ctx_per_slot:
                raise InvalidArgument(
                    f"the prompt ({state.turn_tokens} tokens) plus max_tokens ({max_tokens}) exceed the per-slot "
                    f"context of {limits.n_ctx_per_slot} (n_kv_req > n_ctx); shorten them or start the server "
                    "with --context-shift",
                    field="config.stopping.max_tokens",
                )
        state.turns_open += 1
        state.has_history = True
        state.turn_tokens = 0
        session.add_input(tokens, True, replace)


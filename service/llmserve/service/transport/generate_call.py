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
from .protos import logprob_proto, tokens_per_second, turn_end_proto

log = structlog.get_logger("llmserve.generate")


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


class _ClientDone:
    """The client half-closed its side of the stream."""


class Drain:
    """The server is shutting down: end the session once no turn is open."""


class _ReaderFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class GenerateCall:
    def __init__(
        self, engine: Engine, metrics: Metrics, max_input_tokens: int, restore: SavedSession | None = None
    ) -> None:
        self.engine = engine
        self.restore = restore
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
        session = engine.open_session(params, self.sink, deadline, self.restore)
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
                    self._record(event)
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
            chat = tuple((m.role, m.content) for m in state.chat) if state.chat is not None else None
            session.close(chat)

    def _record(self, event: TurnEndEvent) -> None:
        m = self.metrics
        m.turns.labels(event.finish_reason.name).inc()
        m.prompt_tokens.inc(event.prompt_tokens)
        m.cached_tokens.inc(event.cached_tokens)
        m.generated_tokens.inc(event.completion_tokens)
        if event.completion_tokens:
            m.ttft.observe(event.ttft_ms / 1000.0)
        log.info(
            "turn_end",
            status="OK" if event.finish_reason != FinishReason.ERROR else "ERROR",
            finish_reason=event.finish_reason.name,
            prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens,
            completion_tokens=event.completion_tokens,
            queue_ms=round(event.queue_ms, 1),
            ttft_ms=round(event.ttft_ms, 1),
            tokens_per_s=round(tokens_per_second(event), 1),
        )

    async def _read(
        self, first: pb.GenerateRequest, requests: AsyncIterator[pb.GenerateRequest], session: SessionHandle
    ) -> None:
        try:
            self._on_message(first, session)
            async for message in requests:
                self._on_message(message, session)
            if self.state.turn_tokens:  # input without end_of_turn, then half-close: run it
                self._end_turn(session, ())
            self.sink.put_local(_ClientDone())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the writer, which maps it
            self.sink.put_local(_ReaderFailed(exc))

    def _on_message(self, message: pb.GenerateRequest, session: SessionHandle) -> None:
        message = check_decoded(message)
        engine, state = self.engine, self.state
        if message.cancel:
            session.cancel()
        tokens: tuple[int, ...] = ()
        if message.HasField("input") and message.input.WhichOneof("kind") == "messages":
            tokens = self._render_chat(message.input.messages)
            # The whole rendered conversation is this turn's input (the KV reuses its prefix).
            state.turn_tokens = state.session_tokens = len(tokens)
            self._check_sizes()
            if message.end_of_turn:
                self._end_turn(session, tokens, replace=True)
            else:
                session.add_input(tokens, False, replace=True)
            return
        if message.HasField("input"):
            if state.chat is not None:
                raise InvalidArgument("a session that uses chat messages must keep to messages", field="input")
            tokens = input_tokens(engine, message.input, "input", state.needs_bos)
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

    def _render_chat(self, msg: pb.ChatMessages) -> tuple[int, ...]:
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
        if len(state.chat) + len(msg.messages) > MAX_MESSAGES:
            raise InvalidArgument(f"a session holds at most {MAX_MESSAGES} messages", field="input.messages")
        for i, m in enumerate(msg.messages):
            if not m.role:
                raise InvalidArgument("every message needs a role", field=f"input.messages[{i}].role")
            state.chat.append(ChatMessage(m.role, m.content))
        return engine.render_chat(state.chat)

    def _end_turn(self, session: SessionHandle, tokens: tuple[int, ...], replace: bool = False) -> None:
        state, limits = self.state, self.engine.limits
        if state.turn_tokens == 0 and not state.has_history:
            raise InvalidArgument("the turn has no input: send text or token ids", field="input")
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


"""One Generate call: a reader task feeds the engine's session, the writer streams events out.

The reader validates and tokenizes each message and hands input, turn ends and cancels
to the `SessionHandle` (which keeps the session's input rules and its conversation). The
writer turns each of the engine's call events (`Call.events`: observed, recorded) into a
response. The call ends OK once
the client has half-closed and no turn is open; it ends with the executor's status when
the session fails, and with UNAVAILABLE when the server drains between turns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog
from llmserve.v1 import llmserve_pb2 as pb

from ..domain.events import FinishReason, PromptLogprobsEvent, TokenEvent, ToolCall, TurnEndEvent
from ..domain.requests import SessionParams
from ..domain.snapshots import SavedSession
from ..engine.engine import (
    ChatMessage,
    Engine,
    SessionEnded,
    SessionHandle,
    StoredConversation,
    ToolPlan,
    continued,
    kept_turn,
    owner_of,
)
from .errors import DeadlineExceeded, InvalidArgument, Unavailable, check_decoded, error_from_failure
from .inputs import input_tokens
from .responses import logprob_proto, turn_end_proto

log = structlog.get_logger("llmserve.generate")


class _ClientDone:
    """The client half-closed its side of the stream."""


class Drain:
    """The server is shutting down: end the session once no turn is open."""


class _ReaderFailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class GenerateCall:
    """`sink` takes the servicer's `Drain`."""

    def __init__(self, engine: Engine, first: pb.GenerateRequest, params: SessionParams, deadline: float | None,
                 restore: SavedSession | None = None, grammar: object | None = None,
                 tools: ToolPlan | None = None, continues: StoredConversation | None = None, owner: str = "",
                 prefix: SavedSession | None = None) -> None:
        """`grammar`: the compiled constraint (Engine.compile_async); `tools`: the session's plan;
        `continues`: the stored conversation the first messages follow (`stored_conversation`);
        `owner`: the caller's key, whose stored turns `config.store` keeps (`kept_turn`); `prefix`:
        the stored turn's saved KV (`engine.stored_kv.continued`)."""
        self.engine = engine
        self.continues = continues
        self.owner = owner
        self.first = first
        self.request_id = params.request_id
        add_bos = first.config.add_bos if first.config.HasField("add_bos") else True
        self.call = engine.call(params, deadline, restore=restore, prefix=prefix, grammar=grammar, add_bos=add_bos,
                                tools=tools, one_turn=False)
        self.sink = self.call.sink

    async def run(self, requests: AsyncIterator[pb.GenerateRequest]) -> AsyncIterator[pb.GenerateResponse]:
        with self.call:
            session = self.call.open()
            reader = asyncio.create_task(self._read(self.first, requests, session))
            try:
                async for response in self._responses(session):
                    yield response
            except SessionEnded as exc:  # the executor's status
                raise error_from_failure(exc.kind, str(exc)) from None
            finally:
                reader.cancel()  # before the session closes

    async def _responses(self, session: SessionHandle) -> AsyncIterator[pb.GenerateResponse]:
        client_done = draining = False
        async for tag, event in self.call.events():
            if tag is not None:
                assert isinstance(event, (TokenEvent, PromptLogprobsEvent, TurnEndEvent))
                response = _response(self.request_id, event)
                if self.first.config.store and isinstance(event, TurnEndEvent) and event.index == 0:
                    response.turn_end.stored_id = kept_turn(self.engine.conversations, session.conversation,
                                                            self.owner, self.engine.model_name)
                yield response
                # gRPC ends a call past its deadline with a status; HTTP with a finish reason
                if isinstance(event, TurnEndEvent) and event.finish_reason == FinishReason.DEADLINE:
                    raise DeadlineExceeded("the call's deadline expired")
            elif isinstance(event, _ClientDone):
                client_done = True
            elif isinstance(event, Drain):
                draining = True
            elif isinstance(event, _ReaderFailed):
                raise event.error
            if session.num_turns_open == 0:
                if client_done:
                    return
                if draining:
                    raise Unavailable("the server is shutting down")

    async def _read(
        self, first: pb.GenerateRequest, requests: AsyncIterator[pb.GenerateRequest], session: SessionHandle
    ) -> None:
        try:
            await self._on_message(first, session)
            async for message in requests:
                await self._on_message(message, session)
            session.end_input()
            self.sink.put_local(_ClientDone())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the writer, which maps it
            self.sink.put_local(_ReaderFailed(exc))

    async def _on_message(self, message: pb.GenerateRequest, session: SessionHandle) -> None:
        message = check_decoded(message)
        if message.cancel:
            session.cancel()
        if message.HasField("input") and message.input.WhichOneof("kind") == "messages":
            messages = [ChatMessage(m.role, m.content, tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                                    m.tool_call_id) for m in message.input.messages.messages]
            if self.continues is not None:  # after the leading system messages, as an HTTP continuation's
                lead = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages))
                messages, self.continues = continued(self.continues, messages, lead), None
            await session.add_messages(messages, message.end_of_turn)
            return
        tokens: tuple[int, ...] = ()
        if self.continues is not None and message.HasField("input"):
            raise InvalidArgument("config.continue_from continues a chat: send input.messages", field="input")
        if self.first.config.store and message.HasField("input"):
            raise InvalidArgument("config.store keeps a chat: send input.messages", field="config.store")
        if message.HasField("input"):
            session.check_takes_tokens()
            tokens = await input_tokens(self.engine, message.input, "input", session.needs_bos)
        session.add_tokens(tokens, message.end_of_turn)


def stored_conversation(engine: Engine, config: pb.SessionConfig, credentials: str) -> StoredConversation | None:
    """The stored conversation `config.continue_from` names, if the caller's key (`credentials`:
    its authorization metadata) stored it; InvalidArgument naming the field if not."""
    if not config.continue_from:
        return None
    if config.session_id:
        raise InvalidArgument("a named session resumes its own conversation; continue_from starts one from a "
                              "stored conversation", field="config.continue_from")
    stored = engine.conversations.get(config.continue_from, owner_of(credentials))
    if stored is None:
        raise InvalidArgument(f"no stored conversation {config.continue_from!r} (never stored, deleted, expired, "
                              "or stored with another key)", field="config.continue_from")
    return stored


def _response(request_id: str, event: TokenEvent | PromptLogprobsEvent | TurnEndEvent) -> pb.GenerateResponse:
    if isinstance(event, TokenEvent):
        chunk = pb.TokenChunk(text=event.text, token_ids=event.token_ids,
                              logprobs=[logprob_proto(lp) for lp in event.logprobs], index=event.index,
                              tool_calls=[pb.ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments=d.arguments)
                                          for d in event.tool_calls])
        return pb.GenerateResponse(request_id=request_id, chunk=chunk)
    if isinstance(event, PromptLogprobsEvent):
        tokens = [logprob_proto(lp) for lp in event.tokens]
        return pb.GenerateResponse(request_id=request_id, prompt_logprobs=pb.PromptLogprobs(tokens=tokens))
    return pb.GenerateResponse(request_id=request_id, turn_end=turn_end_proto(event))

"""One `/v1/chat/completions` request: one engine session of one turn, answered whole or as SSE.

The session is opened with the request's parameters, its messages are the turn, and the
events the executor sends are shown to the handle (`observe`) and turned into OpenAI's
shapes. The session closes however the request ends; a client that disconnects cancels
the handler (aiohttp's handler_cancellation), which closes it, so the slot is free
before the next executor step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

import structlog
from aiohttp import web

from ..domain.events import FinishReason, SessionFailed, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import Engine, LoopSink
from ..turn_record import record_turn, turn_recorder
from . import shapes, tool_calls
from .errors import bad_request, from_exception, from_failure, server_error
from .request import ChatRequest
from .sse import end_stream, write_event
from .structured import compile_constraint

log = structlog.get_logger("llmserve.http.chat")


async def turn_events(engine: Engine, request: ChatRequest, params: SessionParams, max_input_tokens: int,
                      grammar: object | None = None) -> AsyncIterator[TokenEvent | TurnEndEvent]:
    """The turn's token and turn-end events, each shown to the session first; ends after the
    last sample's turn end. ApiError when the engine refuses or ends the session. `grammar`:
    the compiled constraint of `params.sampling.grammar`."""
    sink = LoopSink(asyncio.get_running_loop())
    handle = engine.open_session(params, sink, max_input_tokens, request.deadline, grammar=grammar, tools=request.tools)
    try:
        await handle.add_messages(request.messages, end_of_turn=True)
        while True:
            event = await sink.get()
            if isinstance(event, SessionFailed):
                raise from_failure(event.kind, event.message)
            if not isinstance(event, (TokenEvent, TurnEndEvent)):
                continue  # prompt logprobs: not asked by this wing
            event = await handle.observe(event)  # with tools: the answer's text and the calls as they form
            assert isinstance(event, (TokenEvent, TurnEndEvent))
            if isinstance(event, TurnEndEvent):
                record_turn(engine.metrics, event, params)
            if isinstance(event, TurnEndEvent) and event.finish_reason == FinishReason.ERROR:
                raise bad_request(event.message or "the turn failed")
            yield event
            if isinstance(event, TurnEndEvent) and event.final:
                return
    finally:
        sink.orphans_to(turn_recorder(engine.metrics, params))  # a turn the close cancels is counted
        handle.close()


class ChatResponder:
    def __init__(self, engine: Engine, request: ChatRequest, params: SessionParams, model: str,
                 max_input_tokens: int) -> None:
        self.engine = engine
        self.request = request
        self.params = params
        self.max_input_tokens = max_input_tokens
        self.grammar: object | None = None
        fingerprint = f"llmserve-{engine.version}"
        self.envelope = shapes.Envelope(f"chatcmpl-{params.request_id}", int(time.time()), model, fingerprint)

    def _piece(self, token_id: int) -> str:
        return self.engine.pieces([token_id])[0].decode("utf-8", "replace")

    def _logprobs(self, event: TokenEvent) -> list[dict[str, object]] | None:
        return shapes.token_logprobs(event, self._piece) if self.request.logprobs else None

    def _events(self) -> AsyncIterator[TokenEvent | TurnEndEvent]:
        return turn_events(self.engine, self.request, self.params, self.max_input_tokens, self.grammar)

    async def _constrain(self) -> None:
        """The request's constraint (response_format, grammar, regex, choice, or the tool
        reply's schema) compiled into the session's parameters."""
        if self.request.constraint is not None:
            gbnf, self.grammar = await compile_constraint(self.engine, self.request.constraint)
            self.params = replace(self.params, sampling=replace(self.params.sampling, grammar=gbnf))

    def _choice(self, index: int, text: str, end: TurnEndEvent,
                logprobs: list[dict[str, object]] | None) -> dict[str, object]:
        finish = shapes.FINISH_REASONS.get(end.finish_reason, "stop")
        if end.tool_calls:
            return shapes.choice(index, None, finish, None, tool_calls.openai_calls(end.tool_calls))
        return shapes.choice(index, text, finish, logprobs)

    async def whole(self) -> web.Response:
        await self._constrain()
        n = self.params.num_samples
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list[dict[str, object]]] = [[] for _ in range(n)]
        ends: dict[int, TurnEndEvent] = {}
        async with aclosing(self._events()) as events:
            async for event in events:
                if isinstance(event, TokenEvent):
                    texts[event.index].append(event.text)
                    logprobs[event.index] += self._logprobs(event) or []
                else:
                    ends[event.index] = event
        choices = [self._choice(i, "".join(texts[i]), ends[i], logprobs[i] if self.request.logprobs else None)
                   for i in range(n)]
        return web.json_response(self.envelope.completion(choices, shapes.usage(ends)))

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        """SSE: each sample's role, its content (or tool-call) deltas, its finish reason; the
        usage when asked; `[DONE]`. An error after the headers went out is an `error` event
        instead."""
        await self._constrain()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        ends: dict[int, TurnEndEvent] = {}
        with_usage = self.request.include_usage
        try:
            async with aclosing(self._events()) as events:
                async for event in events:
                    if not response.prepared:  # the headers wait for the first event: earlier errors keep their status
                        await response.prepare(http_request)
                        for i in range(self.params.num_samples):
                            await self._send(response, shapes.delta(i, {"role": "assistant", "content": ""}))
                    if isinstance(event, TokenEvent):
                        if event.tool_calls:
                            fields: dict[str, object] = {"tool_calls": tool_calls.openai_deltas(event.tool_calls)}
                            await self._send(response, shapes.delta(event.index, fields))
                        elif event.text or event.logprobs and self.request.logprobs:
                            fields = {"content": event.text}
                            await self._send(response, shapes.delta(event.index, fields, None, self._logprobs(event)))
                    else:
                        ends[event.index] = event
                        finish = shapes.FINISH_REASONS.get(event.finish_reason, "stop")
                        await self._send(response, shapes.delta(event.index, {}, finish))
        except ConnectionError:
            return response  # the client went away: the session is closed (aclosing), nobody to tell
        except Exception as exc:  # noqa: BLE001 - before the headers: the status; after: an error event
            if not response.prepared:
                raise
            error = from_exception(exc)
            if error is None:
                log.exception("stream_failed")
                error = server_error()
            await end_stream(response, error.body())
            return response
        try:
            if with_usage:
                await self._send(response, None, shapes.usage(ends))
        except ConnectionError:
            return response  # the client left after the last event
        await end_stream(response)
        return response

    async def _send(self, response: web.StreamResponse, choice: dict[str, object] | None,
                    usage: dict[str, object] | None = None) -> None:
        chunk = self.envelope.chunk([choice] if choice is not None else [], self.request.include_usage, usage)
        await write_event(response, chunk)

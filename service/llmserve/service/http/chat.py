"""One `/v1/chat/completions` request: one engine session of one turn, answered whole or as SSE.

The request's call (`Engine.call`) opens the session with the request's parameters; its
messages are the turn; its events, observed and recorded by the engine, are turned into
OpenAI's shapes. The session closes however the request ends; a client that disconnects
cancels the handler (aiohttp's handler_cancellation), which closes it, so the slot is free
before the next executor step.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from aiohttp import web

from ..domain.events import TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..domain.snapshots import SavedSession
from ..engine.engine import Call, Engine, Usage
from . import shapes, tool_calls
from .request import ChatRequest
from .sse import serve_stream, write_event


class ChatResponder:
    def __init__(self, engine: Engine, request: ChatRequest, params: SessionParams, model: str) -> None:
        self.engine = engine
        self.request = request
        self.params = params
        self.grammar: object | None = None
        self.prefix: SavedSession | None = None  # saved KV of the start of the input (Engine.call)
        fingerprint = f"llmserve-{engine.version}"
        self.envelope = shapes.Envelope(f"chatcmpl-{params.request_id}", int(time.time()), model, fingerprint)

    def _piece(self, token_id: int) -> str:
        return self.engine.pieces([token_id])[0].decode("utf-8", "replace")

    def _logprobs(self, event: TokenEvent) -> list[dict[str, object]] | None:
        return shapes.token_logprobs(event, self._piece) if self.request.logprobs else None

    def _events(self) -> AsyncIterator[tuple[int, shapes.Event]]:
        """The turn's events: one session, its messages the turn."""
        async def start(call: Call) -> None:
            await call.open().add_messages(self.request.messages, end_of_turn=True)

        call = self.engine.call(self.params, self.request.deadline, prefix=self.prefix, grammar=self.grammar,
                                tools=self.request.tools)
        return shapes.call_events(call, start)

    async def _constrain(self) -> None:
        """The request's constraint (response_format, grammar, regex, choice, or the tool
        reply's schema) compiled into the session's parameters."""
        if (constraint := self.request.constraint) is not None:
            gbnf, self.grammar = await self.engine.compile_async(constraint.kind, constraint.text, constraint.param)
            self.params = replace(self.params, sampling=replace(self.params.sampling, grammar=gbnf))

    def _choice(self, index: int, text: str, end: TurnEndEvent,
                logprobs: list[dict[str, object]] | None) -> dict[str, object]:
        finish = shapes.finish(end)
        if end.tool_calls:
            return shapes.choice(index, None, finish, None, tool_calls.openai_calls(end.tool_calls))
        return shapes.choice(index, text, finish, logprobs)

    async def _collect(self) -> tuple[list[str], list[list[dict[str, object]]], dict[int, TurnEndEvent]]:
        """The whole turn: each sample's text, its logprobs (when asked) and its turn end."""
        await self._constrain()
        n = self.params.num_samples
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list[dict[str, object]]] = [[] for _ in range(n)]
        ends: dict[int, TurnEndEvent] = {}
        async with aclosing(self._events()) as events:
            async for _, event in events:
                if isinstance(event, TokenEvent):
                    texts[event.index].append(event.text)
                    logprobs[event.index] += self._logprobs(event) or []
                elif isinstance(event, TurnEndEvent):
                    ends[event.index] = event
        return ["".join(t) for t in texts], logprobs, ends

    async def whole(self) -> web.Response:
        texts, logprobs, ends = await self._collect()
        n = self.params.num_samples
        choices = [self._choice(i, texts[i], ends[i], logprobs[i] if self.request.logprobs else None)
                   for i in range(n)]
        return web.json_response(self.envelope.completion(choices, shapes.usage(Usage.of(ends, n))))

    async def one_reply(self) -> tuple[str, list[dict[str, object]], TurnEndEvent]:
        """The one sample's whole text, its logprobs (when asked) and its turn end (the
        Responses and Messages routes, n = 1)."""
        texts, logprobs, ends = await self._collect()
        return texts[0], logprobs[0], ends[0]

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        """SSE: each sample's role, its content (or tool-call) deltas, its finish reason; the
        usage when asked; `[DONE]` (sse.serve_stream)."""
        await self._constrain()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        ends: dict[int, TurnEndEvent] = {}

        async def events() -> None:
            async with aclosing(self._events()) as events:
                async for _, event in events:
                    if not response.prepared:  # the headers wait for the first event: earlier errors keep their status
                        await response.prepare(http_request)
                        for i in range(self.params.num_samples):
                            await self._send(response, shapes.delta(i, {"role": "assistant", "content": ""}))
                    if isinstance(event, TokenEvent):
                        await self._send_tokens(response, event)
                    elif isinstance(event, TurnEndEvent):
                        ends[event.index] = event
                        await self._send(response, shapes.delta(event.index, {}, shapes.finish(event)))

        async def last() -> None:
            if self.request.include_usage:
                await self._send(response, None, shapes.usage(Usage.of(ends, self.params.num_samples)))

        return await serve_stream(response, events, last)

    async def _send_tokens(self, response: web.StreamResponse, event: TokenEvent) -> None:
        if event.tool_calls:
            fields: dict[str, object] = {"tool_calls": tool_calls.openai_deltas(event.tool_calls)}
            await self._send(response, shapes.delta(event.index, fields))
        elif event.text or event.logprobs and self.request.logprobs:
            fields = {"content": event.text}
            await self._send(response, shapes.delta(event.index, fields, None, self._logprobs(event)))

    async def _send(self, response: web.StreamResponse, choice: dict[str, object] | None,
                    usage: dict[str, object] | None = None) -> None:
        chunk = self.envelope.chunk([choice] if choice is not None else [], self.request.include_usage, usage)
        await write_event(response, chunk)

"""One `/v1/responses` request (OpenAI Responses): one engine session of one turn, answered
whole or as the Responses API's server-sent events.

The call is the chat wing's (`ChatResponder`'s events); this module only spells the reply:
output items, a `message` with one `output_text` part and a `function_call` per call, the
status (`completed`, or `incomplete` with `max_output_tokens` when a limit cut it), and
`usage` with `input_tokens_details.cached_tokens` from the prefix cache. Streamed, every
event carries `sequence_number`: `response.created`, `response.in_progress`, per item
`response.output_item.added`, for text `response.content_part.added`,
`response.output_text.delta`, `response.output_text.done`, `response.content_part.done`, for
a call `response.function_call_arguments.delta` / `.done`, then `response.output_item.done`;
last `response.completed` or `response.incomplete`. An error after the headers is an `error`
event. The route stores the finished response when asked (`on_done`, agent_routes.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from ..domain.events import FinishReason, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..engine.engine import Engine, Usage
from .chat import ChatResponder
from .errors import ApiError
from .request import ChatRequest
from .responses_request import echo, responses_param
from .sse import serve_events, write_named_event

CUT = (FinishReason.LENGTH, FinishReason.CONTEXT_FULL, FinishReason.DEADLINE)


def usage(counted: Usage) -> dict[str, object]:
    return {"input_tokens": counted.prompt_tokens, "input_tokens_details": {"cached_tokens": counted.cached_tokens},
            "output_tokens": counted.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counted.total_tokens}


def message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, object]] | None = None
                 ) -> dict[str, object]:
    content = [output_text(text, logprobs)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def output_text(text: str, logprobs: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The message's one content part; `logprobs`: each token's (`include` message.output_text.logprobs),
    in chat's shape, which is the Responses API's too (token, logprob, bytes, top_logprobs)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, object]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


Done = Callable[[dict[str, object], str, TurnEndEvent], None]  # the response, its text, its turn's end


class ResponsesResponder(ChatResponder):
    """`ChatResponder`'s call, the Responses API's shapes; `body`: the request's fields."""

    def __init__(self, engine: Engine, request: ChatRequest, params: SessionParams, model: str,
                 on_done: Done | None = None) -> None:
        """`on_done`: told the finished response (the route stores it)."""
        super().__init__(engine, request, params, model)
        self.on_done = on_done
        # the id stored responses are found by: unique, not the client's x-request-id (which
        # two callers may share, and one could then overwrite or read the other's by it)
        self.response_id = f"resp_{uuid.uuid4().hex}"

    def _done(self, whole: dict[str, object], text: str, end: TurnEndEvent) -> dict[str, object]:
        if self.on_done is not None:
            self.on_done(whole, text, end)
        return whole

    def response(self, body: dict[str, Any], output: list[dict[str, object]], end: TurnEndEvent | None
                 ) -> dict[str, object]:
        status, incomplete = "in_progress", None
        if end is not None:
            status = "incomplete" if end.finish_reason in CUT else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.response_id, "object": "response", "created_at": int(time.time()),
                "status": status, "error": None, "incomplete_details": incomplete, "model": self.envelope.head["model"],
                "output": output, **echo(body),
                "usage": usage(Usage.of({0: end}, 1)) if end is not None else None}

    def _output(self, text: str, end: TurnEndEvent, logprobs: list[dict[str, object]] | None = None
                ) -> list[dict[str, object]]:
        rid = self.params.request_id
        output = [message_item(f"msg_{rid}", text, "completed", logprobs)] if text or not end.tool_calls else []
        return output + [call_item(f"fc_{rid}_{i}", c.id, c.name, c.arguments, "completed")
                         for i, c in enumerate(end.tool_calls)]

    async def whole_response(self, body: dict[str, Any]) -> web.Response:
        text, logprobs, end = await self.one_reply()
        return web.json_response(self._done(self.response(body, self._output(text, end, logprobs), end), text, end))

    async def stream_response(self, http_request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        await self._constrain()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        sender = _Sender(response)
        items = _Items(sender.send, self.params.request_id, self._logprobs)

        async def events() -> None:
            async with aclosing(self._events()) as events:
                async for _, event in events:
                    if not response.prepared:  # the headers wait for the first event: earlier errors keep their status
                        await response.prepare(http_request)
                        for kind in ("response.created", "response.in_progress"):
                            await sender.send(kind, {"response": self.response(body, [], None)})
                    if isinstance(event, TokenEvent):
                        await items.add(event)
                    elif isinstance(event, TurnEndEvent):
                        await items.close()
                        output = self._output(items.text, event, items.logprobs)
                        whole = self._done(self.response(body, output, event), items.text, event)
                        await sender.send(f"response.{whole['status']}", {"response": whole})

        async def error_event(error: ApiError) -> None:
            await sender.send("error", {"code": error.code or error.kind, "message": error.message,
                                        "param": responses_param(error.param)})

        return await serve_events(response, events, error_event)


class _Items:
    """The output items of a streamed reply, each added, filled and done in order (their ids
    as the whole response names them)."""

    def __init__(self, send: Callable[[str, dict[str, Any]], Awaitable[None]], request_id: str,
                 logprobs: Callable[[TokenEvent], list[dict[str, object]] | None]) -> None:
        self._send = send
        self._rid = request_id
        self._logprobs = logprobs  # a token event's entries, or None when not asked
        self.logprobs: list[dict[str, object]] = []
        self._index = -1
        self._open: dict[str, Any] | None = None
        self._num_calls = 0
        self.text = ""

    async def _add(self, item: dict[str, Any]) -> None:
        await self.close()
        self._index += 1
        self._open = item
        await self._send("response.output_item.added", {"output_index": self._index, "item": item})

    async def close(self) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        at = {"item_id": item["id"], "output_index": self._index}
        if item["type"] == "message":
            part = output_text(self.text, self.logprobs)
            await self._send("response.output_text.done", {**at, "content_index": 0, "text": self.text,
                                                           "logprobs": self.logprobs})
            await self._send("response.content_part.done", {**at, "content_index": 0, "part": part})
            item = message_item(item["id"], self.text, "completed", self.logprobs)
        else:
            await self._send("response.function_call_arguments.done", {**at, "name": item["name"],
                                                                        "arguments": item["arguments"]})
            item = {**item, "status": "completed"}
        await self._send("response.output_item.done", {"output_index": self._index, "item": item})

    async def add(self, event: TokenEvent) -> None:
        logprobs = self._logprobs(event) or []  # a token with no text of its own (the end's) has its logprob too
        in_text = self._open is None or self._open["type"] == "message"
        if event.text or (logprobs and in_text and not event.tool_calls):
            if self._open is None or self._open["type"] != "message":
                await self._add(message_item(f"msg_{self._rid}", "", "in_progress"))
                await self._send("response.content_part.added", {
                    "item_id": f"msg_{self._rid}", "output_index": self._index, "content_index": 0,
                    "part": output_text("")})
            self.text += event.text
            self.logprobs += logprobs
            await self._send("response.output_text.delta", {"item_id": f"msg_{self._rid}", "output_index": self._index,
                                                            "content_index": 0, "delta": event.text, "logprobs": logprobs})
        for call in event.tool_calls:
            if call.name:  # a call's head: a new item
                await self._add(call_item(f"fc_{self._rid}_{self._num_calls}", call.id, call.name, "", "in_progress"))
                self._num_calls += 1
            if call.arguments and self._open is not None:
                self._open["arguments"] += call.arguments
                await self._send("response.function_call_arguments.delta", {
                    "item_id": self._open["id"], "output_index": self._index, "delta": call.arguments})


class _Sender:
    """Events with their `sequence_number`."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.sequence_number = 0

    async def send(self, kind: str, data: dict[str, Any]) -> None:
        await write_named_event(self.response, kind, {**data, "sequence_number": self.sequence_number})
        self.sequence_number += 1

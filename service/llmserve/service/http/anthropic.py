"""One `/v1/messages` request (Anthropic Messages): one engine session of one turn, answered
whole or as Anthropic's server-sent events; and the Anthropic error shape.

The call is the chat wing's (`ChatResponder`'s events: the messages are the turn, tools and
constraints compiled the same way); this module only spells the reply: content blocks
(`text`, `tool_use` with its `input` parsed), `stop_reason` (end_turn, max_tokens,
stop_sequence with the matched `stop_sequence`, tool_use), `usage` with
`cache_read_input_tokens` from the prefix cache (`input_tokens` counts the rest of the
prompt, as Anthropic's does). Streamed: `message_start`, `ping`, per block
`content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta`) /
`content_block_stop`, then `message_delta` (stop reason and the whole usage: the prompt's
tokens are known once it ran, so `message_start` carries zeros) and `message_stop`; an error
after the headers is an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from ..domain.events import FinishReason, TokenEvent, TurnEndEvent
from ..engine.engine import Usage
from .chat import ChatResponder
from .errors import ApiError
from .sse import serve_events, write_named_event

STOP_REASONS = {
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.CONTEXT_FULL: "max_tokens",
    FinishReason.DEADLINE: "max_tokens",
}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


def error_body(error: ApiError) -> dict[str, object]:
    """Anthropic's error object: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def usage(counted: Usage) -> dict[str, int]:
    return {"input_tokens": counted.prompt_tokens - counted.cached_tokens, "output_tokens": counted.completion_tokens,
            "cache_read_input_tokens": counted.cached_tokens, "cache_creation_input_tokens": 0}


def _tool_input(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:  # held to the tool's schema, so JSON; kept as text if a cut reply left it short
        return {"arguments": arguments}


class MessagesResponder(ChatResponder):
    """`ChatResponder`'s call, Anthropic's shapes."""

    def _message(self, content: list[dict[str, object]], end: TurnEndEvent | None) -> dict[str, object]:
        counted = Usage.of({0: end}, 1) if end is not None else Usage(0, 0, 0)
        return {"id": f"msg_{self.params.request_id}", "type": "message", "role": "assistant",
                "model": self.envelope.head["model"], "content": content,
                "stop_reason": STOP_REASONS.get(end.finish_reason, "end_turn") if end else None,
                "stop_sequence": (end.matched_stop or None) if end else None, "usage": usage(counted)}

    async def whole(self) -> web.Response:
        text, _, end = await self.one_reply()
        content: list[dict[str, object]] = []
        if text or not end.tool_calls:
            content.append({"type": "text", "text": text})
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)}
                    for c in end.tool_calls]
        return web.json_response(self._message(content, end))

    async def stream(self, http_request: web.Request) -> web.StreamResponse:
        await self._constrain()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        blocks = _Blocks(lambda kind, data: write_named_event(response, kind, data))

        async def events() -> None:
            async with aclosing(self._events()) as events:
                async for _, event in events:
                    if not response.prepared:  # the headers wait for the first event: earlier errors keep their status
                        await response.prepare(http_request)
                        await write_named_event(response, "message_start", {"message": self._message([], None)})
                        await write_named_event(response, "ping", {})
                    if isinstance(event, TokenEvent):
                        await blocks.add(event)
                    elif isinstance(event, TurnEndEvent):
                        await blocks.close()
                        whole = self._message([], event)
                        await write_named_event(response, "message_delta", {"delta": {
                            "stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]},
                            "usage": whole["usage"]})
                        await write_named_event(response, "message_stop", {})

        async def error_event(error: ApiError) -> None:
            await write_named_event(response, "error", {"error": error_body(error)["error"]})

        return await serve_events(response, events, error_event)


class _Blocks:
    """The content blocks of a streamed reply, each opened, filled and closed in order."""

    def __init__(self, send: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
        self._send = send
        self._index = -1
        self._open: str | None = None  # the open block's type

    async def _start(self, block: dict[str, object]) -> None:
        await self.close()
        self._index += 1
        self._open = str(block["type"])
        await self._send("content_block_start", {"index": self._index, "content_block": block})

    async def close(self) -> None:
        if self._open is not None:
            await self._send("content_block_stop", {"index": self._index})
            self._open = None

    async def add(self, event: TokenEvent) -> None:
        if event.text:
            if self._open != "text":
                await self._start({"type": "text", "text": ""})
            await self._send("content_block_delta", {"index": self._index,
                                                     "delta": {"type": "text_delta", "text": event.text}})
        for call in event.tool_calls:
            if call.name:  # a call's head: a new tool_use block
                await self._start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            if call.arguments:
                await self._send("content_block_delta", {"index": self._index, "delta": {
                    "type": "input_json_delta", "partial_json": call.arguments}})

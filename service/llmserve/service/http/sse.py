"""Server-sent events: OpenAI's, one `data: {json}\n\n` per event, then `data: [DONE]`, an
error after the headers an `error` object (`serve_stream`); the Responses and Messages APIs
name each event (`event: <type>`) and end without `[DONE]` (`serve_events`, with their own
error event). A client that goes away at the end is nobody's error."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import structlog
from aiohttp import web

from .errors import ApiError, from_exception, server_error

log = structlog.get_logger("llmserve.http.sse")


async def write_event(response: web.StreamResponse, data: dict[str, object]) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


async def write_named_event(response: web.StreamResponse, kind: str, data: dict[str, Any]) -> None:
    """`event: <kind>` and its data, `{"type": kind, ...}` (the Responses and Messages APIs' way)."""
    payload = json.dumps({"type": kind, **data}, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"event: {kind}\ndata: {payload}\n\n".encode())


async def serve_stream(response: web.StreamResponse, events: Callable[[], Awaitable[None]],
                       last: Callable[[], Awaitable[None]]) -> web.StreamResponse:
    """An event stream's body, OpenAI's way: `events` writes the events (it prepares `response`
    at its first: an error before it is raised, so it keeps its status), `last` the closing
    chunk (usage), then `[DONE]`; an error after the headers is a `data: {"error": ...}` event."""
    async def done() -> None:
        await last()
        await response.write(b"data: [DONE]\n\n")

    return await serve_events(response, events, lambda error: write_event(response, error.body()), done)


async def serve_events(response: web.StreamResponse, events: Callable[[], Awaitable[None]],
                       write_error: Callable[[ApiError], Awaitable[None]],
                       last: Callable[[], Awaitable[None]] | None = None) -> web.StreamResponse:
    """An event stream's body, every API's way: `events`, then `last` (when the events went
    well) or `write_error` (an error after the headers went out, as the API spells it), then
    the end of the body. A client that goes away ends it, with nobody to tell."""
    try:
        await events()
    except ConnectionError:
        return response  # the client went away: the sessions are closed, nobody to tell
    except Exception as exc:  # noqa: BLE001 - before the headers: the status; after: an error event
        if not response.prepared:
            raise
        error = from_exception(exc)
        if error is None:
            log.exception("stream_failed")
            error = server_error()
        last = partial(write_error, error)
    try:
        if last is not None:
            await last()
        await response.write_eof()
    except ConnectionError:
        pass  # the client left after the last event
    return response

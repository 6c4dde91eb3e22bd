"""Server-sent events, as OpenAI streams them: one `data: {json}\n\n` per event, then
`data: [DONE]`; an error after the headers is an `error` event (`serve_stream`). A client
that goes away at the end is nobody's error."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from .errors import from_exception, server_error

log = structlog.get_logger("llmserve.http.sse")


async def write_event(response: web.StreamResponse, data: dict[str, object]) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


async def end_stream(response: web.StreamResponse, error: dict[str, object] | None = None) -> None:
    """The last event (an `error` object, or `[DONE]`) and the end of the body; a client
    that already left gets neither."""
    try:
        if error is not None:
            await write_event(response, error)
        else:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionError:
        pass


async def serve_stream(response: web.StreamResponse, events: Callable[[], Awaitable[None]],
                       last: Callable[[], Awaitable[None]]) -> web.StreamResponse:
    """An event stream's body, every route's way: `events` writes the events (it prepares
    `response` at its first: an error before it is raised, so it keeps its status), `last`
    the closing chunk (usage), then `[DONE]`. An error after the headers went out is an
    `error` event instead; a client that goes away ends it, with nobody to tell."""
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
        await end_stream(response, error.body())
        return response
    try:
        await last()
    except ConnectionError:
        return response  # the client left after the last event
    await end_stream(response)
    return response

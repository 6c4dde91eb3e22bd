"""Server-sent events, as OpenAI streams them: one `data: {json}\n\n` per event, then
`data: [DONE]`. A client that goes away at the end is nobody's error."""

from __future__ import annotations

import json

from aiohttp import web


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

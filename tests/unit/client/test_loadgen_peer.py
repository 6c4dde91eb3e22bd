"""The llama-server load generator survives llama-server's connection handling (a fake
HTTP server stands in: it streams a reply, then closes the connection a moment later
without saying so, as llama-server did; a reused connection then failed every other call)."""

from __future__ import annotations

import asyncio
import json

from llmserve.client import loadgen

TOKENS = 3


async def _reply_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    body = json.loads(await reader.readexactly(length))
    events = [{"content": "x"}] * min(body["n_predict"], TOKENS) + [{"stop": True, "tokens_predicted": min(body["n_predict"], TOKENS)}]
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for event in events:
        data = f"data: {json.dumps(event)}\n\n".encode()
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)  # the client has already sent its next call on this connection
    writer.close()


async def _level(concurrency: int, rounds: int) -> loadgen.LevelResult:
    server = await asyncio.start_server(_reply_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await loadgen.peer_level(f"http://127.0.0.1:{port}", concurrency, rounds, TOKENS)


def test_every_call_to_a_server_that_closes_after_each_reply_is_counted() -> None:
    result = asyncio.run(_level(concurrency=2, rounds=3))
    assert (result.errors, result.tokens, len(result.ttft_ms)) == (0, 2 * 3 * TOKENS, 6)
    assert result.checked() is result


def test_a_level_with_failed_calls_gives_no_figure() -> None:
    result = loadgen.LevelResult(4, wall_s=1.0, tokens=64, errors=1)
    try:
        result.checked()
    except RuntimeError as error:
        assert "1 calls failed at concurrency 4" in str(error)
    else:
        raise AssertionError("a level with a failed call was reported")

"""http/sse.py: a client that leaves as the stream ends is nobody's error (the fuzzer's
HTTP mode saw `[DONE]` written to a closed transport logged as an internal error)."""

from __future__ import annotations

import asyncio

from llmserve.service.http.sse import serve_stream, write_event


class _Gone:
    prepared = True  # the headers went out

    def __init__(self) -> None:
        self.written: list[bytes] = []

    async def write(self, data: bytes) -> None:
        raise ConnectionResetError("Cannot write to closing transport")

    async def write_eof(self) -> None:
        raise ConnectionResetError("Cannot write to closing transport")


class _Open(_Gone):
    async def write(self, data: bytes) -> None:
        self.written.append(data)

    async def write_eof(self) -> None:
        self.written.append(b"<eof>")


async def _nothing() -> None:
    pass


async def _fails() -> None:
    raise ValueError("a bug after the headers")


def test_the_end_of_a_stream_to_a_client_that_left_raises_nothing() -> None:
    asyncio.run(serve_stream(_Gone(), _nothing, _nothing))  # type: ignore[arg-type]  # [DONE] to nobody
    asyncio.run(serve_stream(_Gone(), _fails, _nothing))  # type: ignore[arg-type]  # the error event to nobody


def test_events_and_the_end() -> None:
    response = _Open()

    async def events() -> None:
        await write_event(response, {"a": "é"})  # type: ignore[arg-type]

    asyncio.run(serve_stream(response, events, _nothing))  # type: ignore[arg-type]
    assert response.written == ['data: {"a":"é"}\n\n'.encode(), b"data: [DONE]\n\n", b"<eof>"]


def test_an_error_after_the_headers_is_the_last_event() -> None:
    response = _Open()
    asyncio.run(serve_stream(response, _fails, _nothing))  # type: ignore[arg-type]
    assert response.written[-1] == b"<eof>" and b'"type":"server_error"' in response.written[0]
    assert b"[DONE]" not in b"".join(response.written)

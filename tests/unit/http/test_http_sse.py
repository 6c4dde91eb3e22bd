"""http/sse.py: a client that leaves as the stream ends is nobody's error (the fuzzer's
HTTP mode saw `[DONE]` written to a closed transport logged as an internal error)."""

from __future__ import annotations

import asyncio

from llmserve.service.http.sse import end_stream, write_event


class _Gone:
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


def test_the_end_of_a_stream_to_a_client_that_left_raises_nothing() -> None:
    asyncio.run(end_stream(_Gone()))  # type: ignore[arg-type]
    asyncio.run(end_stream(_Gone(), {"error": {"message": "x"}}))  # type: ignore[arg-type]


def test_events_and_the_end() -> None:
    response = _Open()
    asyncio.run(write_event(response, {"a": "é"}))  # type: ignore[arg-type]
    asyncio.run(end_stream(response))  # type: ignore[arg-type]
    assert response.written == ['data: {"a":"é"}\n\n'.encode(), b"data: [DONE]\n\n", b"<eof>"]

"""The SDK's narrow retry of one-shot calls that a proxy reset before their first response
(`llmserve.client.resets`), against fake stubs: what is retried, and what is not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from llmserve.client import AsyncClient, Client, LLMServeError, pb
from llmserve.client.resets import RESET_ATTEMPTS

RESET = "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))"  # as Envoy's reset reads
CHUNK = pb.GenerateResponse(chunk=pb.TokenChunk(text="Hi"))
END = pb.GenerateResponse(turn_end=pb.TurnEnd(finish_reason=pb.FINISH_REASON_LENGTH))


class FakeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


class FakeStub:
    """Each call plays the next script: the responses it yields, then its error (if any)."""

    def __init__(self, *scripts: tuple[list[Any], FakeError | None]) -> None:
        self.scripts = list(scripts)
        self.calls: list[dict[str, Any]] = []

    def _play(self, kwargs: dict[str, Any]) -> Iterator[Any]:
        self.calls.append(kwargs)
        responses, error = self.scripts.pop(0)
        yield from responses
        if error is not None:
            raise error

    def Generate(self, requests: Any, **kwargs: Any) -> Iterator[Any]:  # noqa: N802 - the RPC's name
        return self._play(kwargs)

    GenerateOnce = Generate

    def Tokenize(self, request: Any, **kwargs: Any) -> Any:  # noqa: N802
        return next(self._play(kwargs))

    GenerateText = Tokenize


def _client(stub: FakeStub, **options: Any) -> Client:
    client = Client("127.0.0.1:1", timeout=30, **options)  # the channel never connects
    client.stub = stub  # type: ignore[assignment]
    return client


def reset() -> FakeError:
    return FakeError(grpc.StatusCode.INTERNAL, RESET)


def test_a_stream_reset_before_its_first_response_is_made_again() -> None:
    stub = FakeStub(([], reset()), ([CHUNK, END], None))
    with _client(stub) as client:
        result = client.generate("Hi", max_tokens=1)
    assert result.text == "Hi" and len(stub.calls) == 2
    assert 0 < stub.calls[1]["timeout"] <= stub.calls[0]["timeout"] <= 30  # one deadline for all attempts


@pytest.mark.parametrize("method", ["stream_once", "generate_text", "tokenize"])
def test_the_other_one_shot_calls_are_made_again_too(method: str) -> None:
    answer = pb.TokenizeResponse(ids=[1]) if method == "tokenize" else (
        pb.GenerateTextResponse() if method == "generate_text" else pb.GenerateOnceResponse(chunk=CHUNK.chunk))
    stub = FakeStub(([], reset()), ([answer], None))
    with _client(stub) as client:
        outcome = getattr(client, method)("Hi")
        list(outcome) if method == "stream_once" else None
    assert len(stub.calls) == 2


def test_a_reply_cut_mid_way_is_not_made_again() -> None:
    """The caller has part of the reply: the call was not `not started`, the INTERNAL stands."""
    stub = FakeStub(([CHUNK], reset()), ([CHUNK, END], None))
    with _client(stub) as client, pytest.raises(LLMServeError) as err:
        client.generate("Hi", max_tokens=2)
    assert err.value.code() == grpc.StatusCode.INTERNAL and len(stub.calls) == 1


@pytest.mark.parametrize("error", [
    FakeError(grpc.StatusCode.INTERNAL, "internal error: KeyError"),  # a server bug is not retried
    FakeError(grpc.StatusCode.UNKNOWN, RESET),
    FakeError(grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 8"),  # CANCEL, not INTERNAL_ERROR
])
def test_only_the_reset_is_recognised(error: FakeError) -> None:
    stub = FakeStub(([], error), ([CHUNK, END], None))
    with _client(stub) as client, pytest.raises(LLMServeError):
        client.generate("Hi", max_tokens=1)
    assert len(stub.calls) == 1


def test_retries_off_and_the_attempt_limit() -> None:
    stub = FakeStub(([], reset()), ([CHUNK, END], None))
    with _client(stub, retries=False) as client, pytest.raises(LLMServeError):
        client.generate("Hi", max_tokens=1)
    assert len(stub.calls) == 1
    stub = FakeStub(*[([], reset())] * (RESET_ATTEMPTS + 1))
    with _client(stub) as client, pytest.raises(LLMServeError) as err:
        client.generate("Hi", max_tokens=1)
    assert len(stub.calls) == RESET_ATTEMPTS and err.value.code() == grpc.StatusCode.INTERNAL


def test_the_async_client_makes_it_again() -> None:
    class AsyncStub(FakeStub):
        def Generate(self, requests: Any, **kwargs: Any) -> Any:  # noqa: N802
            played = self._play(kwargs)

            async def responses() -> Any:
                for response in played:
                    yield response

            return responses()

    async def run() -> tuple[str, int]:
        stub = AsyncStub(([], reset()), ([CHUNK, END], None))
        async with AsyncClient("127.0.0.1:1", timeout=30) as client:
            client.stub = stub  # type: ignore[assignment]
            result = await client.generate("Hi", max_tokens=1)
        return result.text, len(stub.calls)

    assert asyncio.run(run()) == ("Hi", 2)

"""The Python SDK against the real server: sync and asyncio, sessions, typed errors."""

from __future__ import annotations

import asyncio

import pytest
from llmserve.client import AsyncClient, Client, InvalidArgument, pb


def test_sync_session_cancel_and_typed_errors(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=60, wait_for_ready=True) as client:
        assert client.health()
        with client.session(max_tokens=8, temperature=0, ignore_eos=True) as session:
            first = session.ask("The first question is")
            second = session.ask(" and the second one is")
            assert len(first.token_ids) == len(second.token_ids) == 8
            assert second.turn_end.usage.cached_tokens >= first.turn_end.usage.prompt_tokens
        with client.session(max_tokens=500, ignore_eos=True) as session:
            chunks = session.send("Talk for a long time:")
            next(chunks)
            session.cancel()
            rest = list(chunks)
            assert session.turn_end is not None
            assert session.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED
            assert len(rest) < 499
        with pytest.raises(InvalidArgument) as err:
            client.generate("hi", temperature=-1.0)
        assert err.value.field == "config.sampling.temperature"
        assert "temperature" in err.value.details()


def test_embed_streams_any_iterable_in_order(server) -> None:  # type: ignore[no-untyped-def]
    def texts():  # type: ignore[no-untyped-def]  # a generator: read as the stream goes
        for i in range(100):
            yield f"Item number {i} in a lazily produced stream."

    with Client(server.address, timeout=120) as client:
        vectors = client.embed(texts(), batch_size=16)
        first = next(vectors)
        rest = list(vectors)
        solo = next(client.embed(["Item number 57 in a lazily produced stream."]))
    assert len(rest) == 99 and len(first) == len(solo)
    assert sum(a * b for a, b in zip(rest[56], solo)) > 0.99


def test_async_client(server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with AsyncClient(server.address, timeout=60) as client:
            assert await client.health()
            info = await client.model_info()
            assert info.architecture == "gemma3"
            result = await client.generate("Hello", max_tokens=4, temperature=0)
            assert len(result.token_ids) == 4
            ids = await client.tokenize("Hello world")
            assert await client.detokenize(ids[1:]) == "Hello world"
            vectors = [v async for v in client.embed(["a", "b", "c"])]
            assert len(vectors) == 3
            session = client.session(max_tokens=4, temperature=0, ignore_eos=True)
            one = await session.ask("Count: one, two,")
            two = await session.ask(" five, six,")
            await session.close()
            assert two.turn_end.usage.cached_tokens >= one.turn_end.usage.prompt_tokens
            with pytest.raises(InvalidArgument):
                await client.generate("hi", top_p=0.0)

    asyncio.run(run())

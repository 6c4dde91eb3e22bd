"""The Python SDK against the real server: sync and asyncio, sessions, typed errors,
SessionConfig fields, per-call and per-turn timeouts, address lists."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from llmserve.client import AsyncClient, Client, DeadlineExceeded, InvalidArgument, pb

from harness.server import free_port

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


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


def test_session_config_fields_for_real(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=120) as client:
        answer = client.generate("Is water wet? Answer:", grammar='root ::= ("yes" | "no") "."', seed=1, max_tokens=8)
        assert answer.text in ("yes.", "no.")
        person = client.generate("A person as JSON:", json_schema=SCHEMA, temperature=0, max_tokens=60)
        assert set(json.loads(person.text)) == {"name", "age"}
        two = client.generate("Once upon a time", n=2, max_tokens=5, ignore_eos=True, temperature=1.0, seed=3)
        assert [s.turn_end.index for s in two.samples] == [0, 1]
        assert all(len(s.token_ids) == 5 for s in two.samples) and two.text == two.samples[0].text
        probs = client.generate("The capital of France is", max_tokens=3, temperature=0, top_logprobs=3,
                                prompt_logprobs=True)
        assert [lp.token_id for lp in probs.logprobs] == list(probs.token_ids)
        assert all(len(lp.top) == 3 for lp in probs.logprobs) and len(probs.prompt_logprobs) >= 5
        greedy = client.generate("Count: one, two, three,", max_tokens=4, temperature=0, ignore_eos=True)
        stopped = client.generate("Count: one, two, three,", max_tokens=4, temperature=0,
                                  stop_token_ids=[greedy.token_ids[1]])
        # Like with like: `stopped` repeats `greedy` on the slot it left, from its saved logits.
        assert stopped.turn_end.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
        assert stopped.turn_end.matched_stop_token_id == greedy.token_ids[1]
        held = client.generate("Count: one, two, three,", max_tokens=4, temperature=0, min_tokens=3,
                               stop_token_ids=[greedy.token_ids[1]])
        assert held.turn_end.usage.completion_tokens >= 3  # the stop token may not end the turn before 3


def test_chat_messages_through_the_sdk(chat_server) -> None:  # type: ignore[no-untyped-def]
    with Client(chat_server.address, timeout=60) as client:
        with client.session(max_tokens=12, temperature=0) as session:
            first = session.ask([{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "Name a colour."}])
            second = session.ask([{"role": "user", "content": "Name another one."}])
        assert first.text and second.text
        assert second.turn_end.usage.cached_tokens > first.turn_end.usage.prompt_tokens


def test_per_call_and_per_turn_timeouts(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=120) as client:  # each call's timeout= wins over the client's
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.generate("Write a very long story:", max_tokens=2000, ignore_eos=True, timeout=0.5)
        assert time.monotonic() - start < 5
        with pytest.raises(DeadlineExceeded):
            list(client.embed(["a"] * 64, timeout=1e-4))
        with client.session(max_tokens=48, temperature=0, ignore_eos=True) as session:
            with pytest.raises(DeadlineExceeded):
                for _ in session.send("Tell a very long story:", timeout=0.05):
                    pass
            assert session.turn_end is not None and session.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED
            cut = session.turn_end.usage.completion_tokens
            assert cut < 48
            again = session.ask(" Go on.", timeout=120)  # the session outlived the turn's limit
            assert again.turn_end.finish_reason == pb.FINISH_REASON_LENGTH
            assert again.turn_end.usage.cached_tokens >= cut


def test_every_call_takes_its_own_timeout() -> None:
    """Against an address nothing listens on, a call waits for the server (wait-for-ready)
    until its own deadline, not the client's 120 s."""
    with Client(f"127.0.0.1:{free_port()}", timeout=120) as client:
        calls = {
            "stream": lambda: list(client.stream("hi", timeout=0.3)), "generate": lambda: client.generate("hi", timeout=0.3),
            "session": lambda: client.session(timeout=0.3).ask("hi"), "embed": lambda: list(client.embed(["a"], timeout=0.3)),
            "tokenize": lambda: client.tokenize("hi", timeout=0.3), "detokenize": lambda: client.detokenize([2], timeout=0.3),
            "model_info": lambda: client.model_info(timeout=0.3),
        }
        for name, call in calls.items():
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                call()
            assert time.monotonic() - start < 3, name
        assert client.health(timeout=0.3) is False

    async def run() -> None:
        async with AsyncClient(f"127.0.0.1:{free_port()}", timeout=120) as client:
            start = time.monotonic()
            for call in (client.generate("hi", timeout=0.3), client.tokenize("hi", timeout=0.3),
                         client.detokenize([2], timeout=0.3), client.model_info(timeout=0.3)):
                with pytest.raises(DeadlineExceeded):
                    await call
            with pytest.raises(DeadlineExceeded):
                [v async for v in client.embed(["a"], timeout=0.3)]
            with pytest.raises(DeadlineExceeded):
                await client.session(timeout=0.3).ask("hi")
            assert await client.health(timeout=0.3) is False
            assert time.monotonic() - start < 10

    asyncio.run(run())


def test_async_per_call_timeout_and_async_with_session(server) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with AsyncClient(server.address, timeout=120) as client:
            with pytest.raises(DeadlineExceeded):
                await client.generate("Write a very long story:", max_tokens=2000, ignore_eos=True, timeout=0.5)
            async with client.session(max_tokens=48, temperature=0, ignore_eos=True) as session:
                with pytest.raises(DeadlineExceeded):
                    await session.ask("Tell a very long story:", timeout=0.05)
                assert session.turn_end is not None
                assert session.turn_end.finish_reason == pb.FINISH_REASON_CANCELLED
                again = await session.ask(" Go on.", timeout=120)
                assert again.turn_end.finish_reason == pb.FINISH_REASON_LENGTH
            with pytest.raises(InvalidArgument):  # the block raised: the stream is cancelled, the error goes on
                async with client.session(max_tokens=4, temperature=-1.0) as bad:
                    await bad.ask("hi")
            assert len((await client.generate("Hello", max_tokens=2, timeout=60)).token_ids) == 2

    asyncio.run(run())


def _turns(log: Path) -> int:
    return log.read_text().count('"event": "turn_end"')


def test_a_list_of_host_names_is_balanced(server, fresh_server) -> None:  # type: ignore[no-untyped-def]
    servers = (server, fresh_server)
    names = [s.address.replace("127.0.0.1", "localhost") for s in servers]
    before = [_turns(s.log_path) for s in servers]
    with Client(names, timeout=60) as client:
        for i in range(12):
            assert client.generate(f"Call {i}:", max_tokens=1).turn_end.usage.completion_tokens == 1
    time.sleep(0.3)
    spread = [_turns(s.log_path) - b for s, b in zip(servers, before)]
    assert sum(spread) == 12 and min(spread) >= 3, spread

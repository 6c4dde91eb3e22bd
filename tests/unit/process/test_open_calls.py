"""The process's drain counter both surfaces share (open_calls.py), and the named-session
claim every surface keeps (engine/session_claims.py)."""

from __future__ import annotations

import asyncio

import pytest
from llmserve.service.domain.errors import Field, PreconditionFailed
from llmserve.service.engine.session_claims import SessionClaims
from llmserve.service.open_calls import OpenCalls


def test_idle_once_every_surfaces_calls_end_and_the_drain_hooks_run_once() -> None:
    async def scenario() -> None:
        calls = OpenCalls()
        told: list[str] = []
        calls.on_drain(lambda: told.append("grpc"))
        assert await calls.wait_idle(0.01)
        with calls.counted():  # a gRPC call
            with calls.counted():  # an HTTP request
                calls.begin_drain()
                assert calls.draining and told == ["grpc"]
                assert not await calls.wait_idle(0.01)
            assert not await calls.wait_idle(0.01)  # one is still open
        assert await calls.wait_idle(0.01)

    asyncio.run(scenario())


def test_an_exception_still_ends_the_call() -> None:
    async def scenario() -> None:
        calls = OpenCalls()
        with pytest.raises(ValueError), calls.counted():
            raise ValueError
        assert await calls.wait_idle(0.01)

    asyncio.run(scenario())


class _Store:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load(self, session_id: str) -> None:
        self.loaded.append(session_id)
        if session_id == "broken":
            raise OSError("unreadable")


def test_one_stream_per_session_id_and_none_without_a_session_dir() -> None:
    async def scenario() -> None:
        store = _Store()
        claims = SessionClaims(store)  # type: ignore[arg-type]
        assert await claims.claim("") is None and store.loaded == []  # not a named session
        assert await claims.claim("s") is None and store.loaded == ["s"]
        with pytest.raises(PreconditionFailed) as second:
            await claims.claim("s")
        assert second.value.field == Field.SESSION_ID and second.value.retry_after_s == 1.0
        claims.release("s")
        await claims.claim("s")  # the first stream ended: the next may open it
        with pytest.raises(OSError):
            await claims.claim("broken")
        with pytest.raises(OSError):  # a failed load holds nothing
            await claims.claim("broken")
        with pytest.raises(PreconditionFailed, match="--session-dir") as none:
            await SessionClaims(None).claim("s")
        assert none.value.field == Field.SESSION_ID and none.value.retry_after_s is None

    asyncio.run(scenario())

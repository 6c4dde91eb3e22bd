"""The call core every surface uses (engine/call.py `Call`, engine/loop_sink.py): sessions
tagged on one sink each count their own backlog, events come observed and recorded, a
one-turn session closes at its last turn end, a failed session raises `SessionEnded`,
and leaving the call closes what is open and still records a cancelled turn."""

from __future__ import annotations

import asyncio

import pytest
from llmserve.service.domain.errors import FailureKind
from llmserve.service.domain.events import FinishReason, SessionFailed, TokenEvent, TurnEndEvent
from llmserve.service.domain.model_meta import Limits
from llmserve.service.engine.call import Call, SessionEnded, Usage
from llmserve.service.engine.loop_sink import LoopSink
from llmserve.service.metrics import Metrics

from .engine_harness import params


class StubHandle:
    """What a `Call` needs of a `SessionHandle`: observe and close."""

    def __init__(self, sink: object) -> None:
        self.sink = sink  # the session's own, as the executor puts to it
        self.observed: list[object] = []
        self.closed = False

    async def observe(self, event: object) -> tuple[object, ...]:
        self.observed.append(event)
        return (event,)

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def end(index: int = 0, final: bool = True, prompt: int = 3, completion: int = 2) -> TurnEndEvent:
    return TurnEndEvent(FinishReason.STOP, prompt, 1, completion, 0.0, 0.0, 0.0, 0.0, 0, index=index, final=final)


def _call(one_turn: bool = True) -> tuple[Call, list[StubHandle], Metrics]:
    handles: list[StubHandle] = []

    def opener(_params: object, sink: object) -> StubHandle:
        handles.append(StubHandle(sink))
        return handles[-1]

    metrics = Metrics()
    call = Call(LoopSink(asyncio.get_running_loop()), params(), metrics, opener, one_turn)  # type: ignore[arg-type]
    return call, handles, metrics


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_each_tag_counts_its_own_backlog() -> None:
    async def scenario() -> None:
        shared = LoopSink(asyncio.get_running_loop())
        first, second = shared.tagged(0), shared.tagged(1)
        for _ in range(3):
            first.put("a")
        second.put("b")
        shared.put_local("local")  # the loop's own: nobody's backlog
        await _settle()
        assert (first.backlog, second.backlog, shared.backlog) == (3, 1, 0)
        got = [await shared.get_tagged() for _ in range(5)]
        assert got == [(None, "local")] + [(0, "a")] * 3 + [(1, "b")]  # a local event needs no hop
        assert (first.backlog, second.backlog) == (0, 0)

    asyncio.run(scenario())


def test_one_turn_sessions_close_at_their_last_turn_end_and_the_events_end() -> None:
    async def scenario() -> None:
        call, handles, _ = _call()
        with call:
            call.open(), call.open()
            first, second = handles[0].sink, handles[1].sink  # type: ignore[attr-defined]
            first.put(TokenEvent("x", (1,)))
            second.put(end())
            first.put(end(final=False))
            first.put(end(index=1))
            got = [(tag, type(event).__name__) async for tag, event in call.events()]
            assert got == [(0, "TokenEvent"), (1, "TurnEndEvent"), (0, "TurnEndEvent"), (0, "TurnEndEvent")]
            assert all(h.closed for h in handles) and len(handles[0].observed) == 3

    asyncio.run(scenario())


def test_a_failed_session_raises_session_ended_and_leaving_closes_the_rest() -> None:
    async def scenario() -> None:
        call, handles, _ = _call(one_turn=False)
        with pytest.raises(SessionEnded, match="gone") as ended:
            with call:
                call.open()
                handles[0].sink.put(SessionFailed(FailureKind.SHUTDOWN, "gone"))  # type: ignore[attr-defined]
                async for _ in call.events():
                    pass
        assert ended.value.kind == FailureKind.SHUTDOWN and handles[0].closed
        handles[0].sink.put(end())  # type: ignore[attr-defined]  # the close's cancelled turn end, after the call left
        await _settle()
        assert handles[0].observed == []  # recorded as an orphan, not shown to a closed session

    asyncio.run(scenario())


def test_usage_counts_each_prompt_once_and_every_completion() -> None:
    ends = {0: end(prompt=3, completion=2), 1: end(prompt=3, completion=5), 2: end(prompt=4, completion=1),
            3: end(prompt=4, completion=1)}
    assert Usage.of(ends, 2) == Usage(prompt_tokens=7, cached_tokens=2, completion_tokens=9)
    assert Usage.of(ends, 2, completions=False).completion_tokens == 0


def test_limits_rule_the_samples_and_the_input() -> None:
    assert Limits(100, 512, n_parallel=4).max_samples == 4
    assert Limits(100, 512, n_parallel=32).max_samples == 8
    assert Limits(100, 512).max_input_tokens == 512
    assert Limits(100, 512, input_tokens_limit=100).max_input_tokens == 100
    assert Limits(100, 512, input_tokens_limit=4096).max_input_tokens == 512

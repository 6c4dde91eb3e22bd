"""The monotonic times the executor stamps on turn ends and embedding results, which the
transport turns into trace spans (transport/tracing.py): on the fake runner."""

from __future__ import annotations

import time

from llmserve.service.domain.events import EmbedResult, FinishReason, TurnEndEvent
from llmserve.service.domain.requests import EmbedInput

from .engine_harness import ListSink, make, params, run_until, turn_ends
from .fake_runner import BOS


def _in_order(end: TurnEndEvent) -> None:
    times = [end.t_queued, end.t_slot, end.t_ready, end.t_first_token, end.t_end]
    assert times == sorted(times) and end.t_queued > 0, times


def test_a_waiting_session_reports_its_wait_then_prefill_then_decode() -> None:
    executor, _ = make(n_parallel=1)
    first, second = ListSink(), ListSink()
    k1 = executor.open_session(params(max_tokens=2), first)
    executor.add_input(k1, (BOS, 10), True)
    run_until(executor, turn_ends(first))
    k2 = executor.open_session(params(max_tokens=2), second)  # the slot is taken: it waits
    executor.add_input(k2, (BOS, 20), True)
    executor.drain(block=False)
    time.sleep(0.02)
    executor.add_input(k1, (30,), True)  # k1 holds its slot: no wait
    run_until(executor, turn_ends(first, 2))
    executor.close(k1)
    run_until(executor, turn_ends(second))

    for end in first.of(TurnEndEvent):
        _in_order(end)
    later = first.of(TurnEndEvent)[1]
    assert later.queue_ms == 0 and later.t_queued == later.t_slot == later.t_ready
    (waited,) = second.of(TurnEndEvent)
    _in_order(waited)
    assert waited.t_slot - waited.t_queued >= 0.02
    assert abs((waited.t_slot - waited.t_queued) * 1000.0 - waited.queue_ms) < 1e-6
    assert waited.t_end - waited.t_first_token >= 0 and waited.completion_tokens == 2


def test_a_turn_cancelled_while_waiting_never_prefilled() -> None:
    executor, _ = make(n_parallel=1)
    holder, waiting = ListSink(), ListSink()
    k1 = executor.open_session(params(max_tokens=2), holder)
    executor.add_input(k1, (BOS, 10), True)
    run_until(executor, turn_ends(holder))
    k2 = executor.open_session(params(), waiting)
    executor.add_input(k2, (BOS, 20), True)
    executor.drain(block=False)
    executor.cancel(k2)
    run_until(executor, turn_ends(waiting))
    (end,) = waiting.of(TurnEndEvent)
    assert end.finish_reason == FinishReason.CANCELLED
    _in_order(end)
    assert end.t_slot == end.t_ready == end.t_first_token == end.t_end  # all of it was waiting


def test_embedding_results_carry_their_step() -> None:
    executor, _ = make()
    sink = ListSink()
    executor.embed(tuple(EmbedInput(i, (BOS,) * (i + 1), False, False) for i in range(3)), sink)
    run_until(executor, lambda: len(sink.of(EmbedResult)) == 3)
    results = sink.of(EmbedResult)
    steps = {(r.t_batch_start, r.t_batch_end, r.batch_size) for r in results}
    assert all(0 < start <= end and size >= 1 for start, end, size in steps)
    assert sum(size for _, _, size in steps) == 3

"""n > 1 on a fake runner (harness: tests/unit/engine/engine_harness.py): a session's samples
across turns. Each turn forks n - 1 samples onto slots reserved at admission; a forked
sample lives for one turn and gives its slot back to the session's `reserved`; close
frees them all."""

from __future__ import annotations

from dataclasses import replace

from llmserve.service.domain.events import FinishReason, TokenEvent, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams

from .engine_harness import ListSink, assert_kv_mirrors_slots, make, params, run_until, turn_ends
from .fake_runner import BOS


def _tokens_of_each(sink: ListSink, since: int, n: int) -> list[int]:
    """Tokens each sample index streamed since event `since`."""
    events = [e for e in sink.events[since:] if isinstance(e, TokenEvent)]
    return [sum(len(e.token_ids) for e in events if e.index == i) for i in range(n)]


def test_three_samples_over_turns_with_a_cancel_mid_turn_and_input_sent_during_a_turn() -> None:
    executor, runner = make(n_parallel=4)
    p = replace(params(max_tokens=12, ignore_eos=True), sampling=SamplingParams(temperature=1.0, seed=3), num_samples=3)
    sink = ListSink()
    key = executor.open_session(p, sink)
    executor.add_input(key, (BOS, 10, 11), True)
    table = executor.table
    run_until(executor, lambda: min(_tokens_of_each(sink, 0, 3)) >= 3)
    session = table.sessions[key]
    assert [s.index for s in session.samples] == [0, 1, 2] and not session.reserved
    assert sorted(table.samples) == sorted(s.key for s in session.samples) and len(set(table.samples)) == 3
    assert len({s.slot.seq_id for s in session.samples}) == 3  # type: ignore[union-attr]

    executor.cancel(key)  # mid-turn: every sample ends CANCELLED, one end is final
    executor.drain(block=False)
    ends = sink.of(TurnEndEvent)
    assert sorted(e.index for e in ends) == [0, 1, 2]
    assert {e.finish_reason for e in ends} == {FinishReason.CANCELLED}
    assert [e.final for e in ends] == [False, False, True]
    assert [s.index for s in session.samples] == [0] and list(table.samples) == [key]
    assert len(session.reserved) == 2 and all(slot.busy for slot in session.reserved)
    assert session.samples_open == 0
    assert_kv_mirrors_slots(executor, runner)

    mark = len(sink.events)
    executor.add_input(key, (20,), True)  # the next turn forks onto the reserved slots again
    executor.add_input(key, (21,), True)  # sent during that turn: waits for all three samples
    run_until(executor, lambda: len(table.sessions[key].samples) == 3)
    assert not session.reserved and len(session.later) == 1
    run_until(executor, turn_ends(sink, 3))  # the second turn, then the queued one
    later_ends = [e for e in sink.events[mark:] if isinstance(e, TurnEndEvent)]
    assert len(later_ends) == 6 and [e.final for e in later_ends].count(True) == 2
    assert all(e.finish_reason == FinishReason.LENGTH and e.completion_tokens == 12 for e in later_ends)
    assert [sorted(e.index for e in later_ends[:3]), sorted(e.index for e in later_ends[3:])] == [[0, 1, 2]] * 2
    assert later_ends[2].final and later_ends[5].final  # the queued turn began after the last sample ended
    assert _tokens_of_each(sink, mark, 3) == [24, 24, 24]
    assert len(session.reserved) == 2 and list(table.samples) == [key]
    assert_kv_mirrors_slots(executor, runner)

    reserved = list(session.reserved)
    executor.close(key)
    executor.drain(block=False)
    assert not table.sessions and not table.samples
    assert not any(slot.busy for slot, _ in table.slot_states()) and not any(slot.busy for slot in reserved)
    assert_kv_mirrors_slots(executor, runner)


def test_samples_seeds_differ_and_each_turn_reports_the_samples_own_seed() -> None:
    executor, _ = make(n_parallel=3)
    p = replace(params(max_tokens=6, ignore_eos=True), sampling=SamplingParams(temperature=1.0, seed=41), num_samples=3)
    sink = ListSink()
    key = executor.open_session(p, sink)
    executor.add_input(key, (BOS, 10), True)
    run_until(executor, turn_ends(sink))
    executor.add_input(key, (30,), True)
    run_until(executor, turn_ends(sink, 2))
    seeds = sorted((e.index, e.seed) for e in sink.of(TurnEndEvent))
    assert seeds == [(0, 41), (0, 41), (1, 42), (1, 42), (2, 43), (2, 43)]

"""A turn's life on a fake runner (harness: tests/unit/engine/engine_harness.py): the session
table, the step, stop handling, multi-turn, cancel, n > 1, the prefix cache, a waiting
session, embedding steps. Limits and failures: test_engine_limits_fake.py.
"""

from __future__ import annotations

from dataclasses import replace

from llmserve.service.domain.events import EmbedResult, FinishReason, TurnEndEvent
from llmserve.service.domain.requests import EmbedInput, SamplingParams

from .engine_harness import GREEDY, ListSink, assert_kv_mirrors_slots, make, one_turn, params, run_until, turn_ends
from .fake_runner import BOS, END_AFTER, EOG, piece_of


def test_greedy_turn_runs_to_eog() -> None:
    executor, runner = make()
    sink, _ = one_turn(executor, (BOS, 10), params())
    expected = list(range(11, END_AFTER + 1)) + [EOG]
    assert sink.token_ids() == expected
    assert sink.text() == b"".join(piece_of(t) for t in expected).decode()
    (end,) = sink.of(TurnEndEvent)
    assert end.finish_reason == FinishReason.STOP and end.completion_tokens == len(expected)
    assert end.prompt_tokens == 2 and end.final
    assert_kv_mirrors_slots(executor, runner)


def test_max_tokens_ends_with_length() -> None:
    executor, _ = make()
    sink, _ = one_turn(executor, (BOS, 10), params(max_tokens=5))
    assert sink.token_ids() == [11, 12, 13, 14, 15]
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH


def test_stop_string_is_held_back_and_reported() -> None:
    executor, _ = make()
    stop = (piece_of(14) + piece_of(15)).decode()
    sink, _ = one_turn(executor, (BOS, 10), params(stop=(stop,)))
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.STOP_SEQUENCE and end.matched_stop == stop
    assert sink.text() == (piece_of(11) + piece_of(12) + piece_of(13)).decode()


def test_stop_token_id() -> None:
    executor, _ = make()
    sink, _ = one_turn(executor, (BOS, 10), params(stop_token_ids=(13,)))
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.STOP_SEQUENCE and end.matched_stop_token_id == 13
    assert sink.token_ids() == [11, 12, 13]


def test_min_tokens_and_ignore_eos_ban_the_end() -> None:
    executor, _ = make()
    sink, _ = one_turn(executor, (BOS, END_AFTER - 2), params(min_tokens=4, max_tokens=6))
    ids = sink.token_ids()
    assert ids[:2] == [END_AFTER - 1, END_AFTER] and EOG not in ids[:4]
    sink, _ = one_turn(executor, (BOS, END_AFTER - 2), params(ignore_eos=True, max_tokens=6))
    assert EOG not in sink.token_ids() and sink.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH


def test_second_turn_reuses_the_kv() -> None:
    executor, runner = make()
    sink = ListSink()
    key = executor.open_session(params(max_tokens=3), sink)
    executor.add_input(key, (BOS, 10), True)
    run_until(executor, turn_ends(sink, 1))
    executor.add_input(key, (20,), True)
    run_until(executor, turn_ends(sink, 2))
    first, second = sink.of(TurnEndEvent)
    assert second.prompt_tokens == 1 and second.cached_tokens >= 2
    assert sink.token_ids()[3:] == [21, 22, 23]
    assert_kv_mirrors_slots(executor, runner)


def test_input_during_a_turn_waits_for_it() -> None:
    executor, _ = make()
    sink = ListSink()
    key = executor.open_session(params(max_tokens=3), sink)
    executor.add_input(key, (BOS, 10), True)
    executor.add_input(key, (30,), True)  # queued: runs after the first turn ends
    run_until(executor, turn_ends(sink, 2))
    assert sink.token_ids() == [11, 12, 13, 31, 32, 33]


def test_cancel_ends_the_turn_and_keeps_the_session() -> None:
    executor, runner = make()
    sink = ListSink()
    key = executor.open_session(params(), sink)
    executor.add_input(key, (BOS, 10), True)
    run_until(executor, lambda: len(sink.token_ids()) >= 3)
    executor.cancel(key)
    run_until(executor, turn_ends(sink))
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.CANCELLED
    executor.add_input(key, (5,), True)
    run_until(executor, turn_ends(sink, 2))
    assert sink.of(TurnEndEvent)[1].finish_reason == FinishReason.STOP
    assert_kv_mirrors_slots(executor, runner)


def test_n_samples_fork_every_turn_and_free_their_slots_at_close() -> None:
    executor, runner = make(n_parallel=3)
    p = replace(params(max_tokens=4), sampling=SamplingParams(temperature=1.0, seed=3), num_samples=3)
    sink, key = one_turn(executor, (BOS, 10), p)
    ends = sink.of(TurnEndEvent)
    assert sorted(e.index for e in ends) == [0, 1, 2] and [e.final for e in ends].count(True) == 1
    assert all(len(sink.token_ids(i)) == 4 for i in range(3))
    executor.add_input(key, (20,), True)  # the next turn has n samples too, on the same slots
    run_until(executor, turn_ends(sink, 2))
    ends = sink.of(TurnEndEvent)[3:]
    assert sorted(e.index for e in ends) == [0, 1, 2] and ends[-1].final
    assert_kv_mirrors_slots(executor, runner)
    executor.close(key)
    run_until(executor, lambda: not any(slot.busy for slot, _ in executor.table.slot_states()))


def test_closed_session_leaves_a_prefix_cache() -> None:
    executor, runner = make(n_parallel=1)
    _, key = one_turn(executor, (BOS, 10, 11, 12, 13, 14, 15, 16), params(max_tokens=2))
    executor.close(key)
    sink, _ = one_turn(executor, (BOS, 10, 11, 12, 13, 14, 15, 16), params(max_tokens=2))
    assert sink.of(TurnEndEvent)[0].cached_tokens >= 7
    assert_kv_mirrors_slots(executor, runner)


def test_waiting_session_gets_the_slot_when_one_frees() -> None:
    executor, _ = make(n_parallel=1)
    first, second = ListSink(), ListSink()
    k1 = executor.open_session(params(max_tokens=2), first)
    executor.add_input(k1, (BOS, 10), True)
    k2 = executor.open_session(params(max_tokens=2), second)
    executor.add_input(k2, (BOS, 20), True)
    run_until(executor, turn_ends(first))
    assert not second.of(TurnEndEvent) and executor.snapshot.num_waiting in (0, 1)
    executor.close(k1)
    run_until(executor, turn_ends(second))
    assert second.token_ids() == [21, 22]


def test_embeddings_run_in_their_own_steps() -> None:
    executor, _ = make()
    sink = ListSink()
    executor.embed(tuple(EmbedInput(i, (BOS,) * (i + 1), False, False) for i in range(3)), sink)
    run_until(executor, lambda: len(sink.of(EmbedResult)) == 3)
    assert [float(r.vector[0]) for r in sink.of(EmbedResult)] == [1.0, 2.0, 3.0]


def test_no_allowed_token_ends_the_turn() -> None:
    executor, runner = make()
    everything = tuple((t, float("-inf")) for t in range(64))
    p = replace(params(max_tokens=4), sampling=replace(GREEDY, logit_bias=everything))
    sink, key = one_turn(executor, (BOS, 10), p)
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.STOP and end.completion_tokens == 0 and "forbid" in end.message
    executor.add_input(key, (BOS,), True)  # the session goes on
    run_until(executor, turn_ends(sink, 2))
    assert_kv_mirrors_slots(executor, runner)


def test_a_turn_ended_before_its_samples_forked_ends_every_sample() -> None:
    """A deadline (or a cancel) during the prompt of a turn with n = 3: samples 1 and 2
    never forked, yet each sample gets its turn end, the last one final (an HTTP reply
    with n choices needs them all; before, only sample 0's came)."""
    import time

    executor, runner = make(n_parallel=3)
    p = replace(params(max_tokens=4), sampling=SamplingParams(temperature=1.0, seed=3), num_samples=3)
    for end_it in ("deadline", "cancel"):
        sink = ListSink()
        key = executor.open_session(p, sink, time.monotonic() if end_it == "deadline" else None)
        executor.add_input(key, (BOS, 10), True)
        if end_it == "cancel":
            executor.cancel(key)
        run_until(executor, lambda sink=sink: any(e.final for e in sink.of(TurnEndEvent)))
        ends = sink.of(TurnEndEvent)
        assert sorted(e.index for e in ends) == [0, 1, 2] and ends[-1].final and ends[-1].index == 0, ends
        assert len({e.finish_reason for e in ends}) == 1 and ends[0].finish_reason in (
            FinishReason.DEADLINE, FinishReason.CANCELLED)
        executor.close(key)
    run_until(executor, lambda: not any(slot.busy for slot, _ in executor.table.slot_states()))
    assert_kv_mirrors_slots(executor, runner)

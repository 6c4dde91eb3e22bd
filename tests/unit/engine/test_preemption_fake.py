"""A stream whose client stops reading gives up its slot to callers that wait
(preemption by recompute, engine/executor/admission.py), on the fake runner.

Issue 26: as many non-reading streams as slots locked every other caller out until its
deadline while the server sat idle. Here a paused stream's slot goes to the waiter; the
paused stream, once read again, finishes its reply token for token as it would have
without the preemption, its sampler fed each token once."""

from __future__ import annotations

import time

import pytest
from llmserve.service.domain.errors import FailureKind
from llmserve.service.domain.events import FinishReason, SessionFailed, TokenEvent, TurnEndEvent
from llmserve.service.domain.requests import SamplingParams, SessionParams, StoppingParams

from .engine_harness import (
    ReaderSink,
    RecordingStore,
    assert_kv_mirrors_slots,
    make,
    run_until,
    steps,
    turn_ends,
)
from .fake_runner import BOS

SEEDED = SamplingParams(temperature=0.8, seed=11)  # the fake draws among the two best: the rng must not replay


def params(max_tokens: int = 24) -> SessionParams:
    return SessionParams("test", SEEDED, StoppingParams(max_tokens=max_tokens, ignore_eos=True))


def reference(prompt: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The reply and the sampler's history with nobody preempted."""
    executor, _ = make(1, idle_grace_s=0.0)
    sink = ReaderSink()
    key = executor.open_session(params(), sink)
    executor.add_input(key, prompt, True)
    run_until(executor, turn_ends(sink))
    return sink.token_ids(), list(executor.table.sessions[key].main.sampler.history)  # type: ignore[union-attr]


PROMPT_A = (BOS, 5, 6, 7)


def test_a_paused_stream_gives_its_slot_to_a_waiting_caller_and_then_finishes_its_reply() -> None:
    executor, runner = make(n_parallel=1, idle_grace_s=0.0)
    slow = ReaderSink()
    slow_key = executor.open_session(params(), slow)
    executor.add_input(slow_key, PROMPT_A, True)
    steps(executor, 6)  # prefill, then a few tokens
    assert 0 < len(slow.token_ids()) < 24
    slow.stop_reading()
    waiter = ReaderSink()
    waiter_key = executor.open_session(params(max_tokens=4), waiter)
    executor.add_input(waiter_key, (BOS, 30, 31), True)
    run_until(executor, turn_ends(waiter), max_steps=50)
    assert waiter.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH
    assert executor.table.sessions[slow_key].main.slot is None  # gave up its slot
    assert executor.table.admission.num_preempted == 1
    executor.close(waiter_key)
    steps(executor, 5)
    assert not slow.of(TurnEndEvent)  # nobody reads it: it waits, it does not run
    slow.read_all()
    run_until(executor, turn_ends(slow))
    ids, history = reference(PROMPT_A)
    assert slow.token_ids() == ids
    assert executor.table.sessions[slow_key].main.sampler.history == history  # type: ignore[union-attr]
    end = slow.of(TurnEndEvent)[0]
    assert end.completion_tokens == 24 and end.prompt_tokens == len(PROMPT_A)
    assert_kv_mirrors_slots(executor, runner)


def test_without_waiters_a_paused_stream_keeps_its_slot() -> None:
    executor, _ = make(n_parallel=2, idle_grace_s=0.0)
    slow = ReaderSink()
    key = executor.open_session(params(), slow)
    executor.add_input(key, PROMPT_A, True)
    steps(executor, 4)
    slow.stop_reading()
    other = ReaderSink()
    other_key = executor.open_session(params(max_tokens=4), other)
    executor.add_input(other_key, (BOS, 30), True)
    run_until(executor, turn_ends(other))  # a slot was idle: nobody had to give one up
    assert executor.table.sessions[key].main.slot is not None
    assert executor.table.admission.num_preempted == 0


def test_more_paused_streams_than_slots_and_every_reply_completes() -> None:
    executor, runner = make(n_parallel=2, idle_grace_s=0.0)
    prompts = [(BOS, 3 + i, 4 + i) for i in range(4)]
    sinks = [ReaderSink() for _ in prompts]
    keys = []
    for prompt, sink in zip(prompts, sinks):
        keys.append(executor.open_session(params(), sink))
        executor.add_input(keys[-1], prompt, True)
    for _ in range(40):  # whoever holds a slot stops reading as soon as it has tokens
        steps(executor, 1)
        for sink in sinks:
            if sink.token_ids():
                sink.stop_reading()
    waiter = ReaderSink()
    waiter_key = executor.open_session(params(max_tokens=3), waiter)
    executor.add_input(waiter_key, (BOS, 50), True)
    run_until(executor, turn_ends(waiter), max_steps=50)
    for sink in sinks:
        sink.read_all()
    run_until(executor, lambda: all(turn_ends(sink)() for sink in sinks), max_steps=2000)
    for prompt, sink in zip(prompts, sinks):
        assert sink.token_ids() == reference(prompt)[0]
    assert executor.table.admission.num_preempted >= 2
    assert_kv_mirrors_slots(executor, runner)


def test_a_preempted_stream_whose_slot_kept_its_history_counts_it_as_cached() -> None:
    executor, runner = make(n_parallel=2, idle_grace_s=0.0)
    idle = ReaderSink()
    idle_key = executor.open_session(params(max_tokens=5), idle)
    executor.add_input(idle_key, PROMPT_A, True)
    run_until(executor, turn_ends(idle))
    busy = ReaderSink()
    busy_key = executor.open_session(params(max_tokens=200), busy)  # holds the other slot
    executor.add_input(busy_key, (BOS, 20), True)
    steps(executor, 3)
    waiter = ReaderSink()  # shares the idle stream's prompt: it takes that slot's cached prefix
    waiter_key = executor.open_session(params(max_tokens=2), waiter)
    executor.add_input(waiter_key, (*PROMPT_A, 60, 61), True)
    run_until(executor, turn_ends(waiter))
    assert executor.table.admission.num_preempted == 1
    executor.close(waiter_key)
    steps(executor, 1)
    executor.add_input(idle_key, (30,), True)
    run_until(executor, turn_ends(idle, 2))
    second = idle.of(TurnEndEvent)[1]
    assert second.cached_tokens == len(PROMPT_A)  # the prompt the waiter left in the slot; the reply was prefilled again
    assert_kv_mirrors_slots(executor, runner)


@pytest.mark.parametrize("reading", [False, True])
def test_a_stream_between_turns_gives_up_its_slot_and_continues_its_conversation(reading: bool) -> None:
    """Paused or merely idle between turns: a waiting caller takes the slot; the next turn
    continues the transcript (prefilled again, the slot having served the other caller)."""
    executor, runner = make(n_parallel=1, idle_grace_s=0.0)
    slow = ReaderSink()
    key = executor.open_session(params(max_tokens=5), slow)
    executor.add_input(key, PROMPT_A, True)
    run_until(executor, turn_ends(slow))
    if not reading:
        slow.stop_reading()
    waiter = ReaderSink()
    waiter_key = executor.open_session(params(max_tokens=3), waiter)
    executor.add_input(waiter_key, (BOS, 40, 41, 42), True)
    run_until(executor, turn_ends(waiter))
    assert executor.table.admission.num_preempted == 1
    executor.close(waiter_key)
    slow.read_all()
    executor.add_input(key, (20, 21), True)
    run_until(executor, turn_ends(slow, 2))
    ends = slow.of(TurnEndEvent)
    assert [e.finish_reason for e in ends] == [FinishReason.LENGTH, FinishReason.LENGTH]
    assert ends[1].cached_tokens == 1  # the waiter took the slot over: only its BOS matched, the rest was prefilled again
    first_reply = [t for e in slow.of(TokenEvent) for t in e.token_ids][:5]
    history = [*PROMPT_A, *first_reply, 20, 21]
    assert runner.kv[0][: len(history)] == history  # the transcript, in order, once
    assert_kv_mirrors_slots(executor, runner)


@pytest.mark.parametrize("num_samples", [1, 3])
def test_a_stream_that_reads_nothing_for_reader_timeout_ends_deadline_exceeded(num_samples: int) -> None:
    from dataclasses import replace

    executor, _ = make(n_parallel=num_samples, reader_timeout_s=0.05, idle_grace_s=0.0)
    slow = ReaderSink()
    key = executor.open_session(replace(params(), num_samples=num_samples), slow)
    executor.add_input(key, PROMPT_A, True)
    steps(executor, 4)
    slow.stop_reading()
    steps(executor, 2)
    assert not slow.of(SessionFailed)  # paused, not yet for long
    time.sleep(0.06)
    steps(executor, 1)
    failed = slow.of(SessionFailed)
    assert failed and failed[0].kind == FailureKind.DEADLINE and "--reader-timeout" in failed[0].message
    assert key not in executor.table.sessions and not any(slot.busy for slot, _ in executor.table.slot_states())


def test_a_named_session_that_gave_its_slot_up_is_saved_at_close_and_restored() -> None:
    """Found by the combination oracle: a named session preempted after its last turn
    closed with no slot and was not saved; its next stream lost the conversation."""
    from dataclasses import replace

    store = RecordingStore()
    executor, runner = make(1, idle_grace_s=0.0, store=store)
    named = ReaderSink()
    key = executor.open_session(replace(params(max_tokens=5), session_id="s"), named)
    executor.add_input(key, PROMPT_A, True)
    run_until(executor, turn_ends(named))
    waiter = ReaderSink()
    waiter_key = executor.open_session(params(max_tokens=2), waiter)
    executor.add_input(waiter_key, (BOS, 40), True)
    run_until(executor, turn_ends(waiter))
    assert executor.table.admission.num_preempted == 1
    executor.close(key)
    executor.drain(block=False)
    assert len(store.saved) == 1
    saved = store.saved[0]
    reply = named.token_ids()
    assert [*saved.tokens, *saved.pending] == [*PROMPT_A, *reply]  # type: ignore[attr-defined]
    assert saved.state == b""  # type: ignore[attr-defined]  # its KV left with the slot: a restore prefills it
    again = ReaderSink()
    executor2, runner2 = make(n_parallel=1, idle_grace_s=0.0)
    key2 = executor2.open_session(replace(params(max_tokens=3), session_id="s"), again, restore=saved)  # type: ignore[arg-type]
    executor2.add_input(key2, (30,), True)
    run_until(executor2, turn_ends(again))
    assert runner2.kv[0][: len(PROMPT_A) + len(reply) + 1] == [*PROMPT_A, *reply, 30]
    assert_kv_mirrors_slots(executor2, runner2)


def test_a_stream_idle_between_turns_keeps_its_slot_for_the_grace() -> None:
    executor, _ = make(n_parallel=1, idle_grace_s=0.2)
    idle = ReaderSink()
    key = executor.open_session(params(max_tokens=3), idle)
    executor.add_input(key, PROMPT_A, True)
    run_until(executor, turn_ends(idle))
    waiter = ReaderSink()
    waiter_key = executor.open_session(params(max_tokens=2), waiter)
    executor.add_input(waiter_key, (BOS, 40), True)
    steps(executor, 5)
    assert executor.table.sessions[key].main.slot is not None  # its next turn may be on its way
    assert executor.table.admission.idle_timeout(0.02) == 0.05  # the idle loop comes back to look
    time.sleep(0.25)
    run_until(executor, turn_ends(waiter))
    assert executor.table.admission.num_preempted == 1

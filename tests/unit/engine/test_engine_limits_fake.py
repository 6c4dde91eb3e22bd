"""Limits and failures on a fake runner (harness: tests/unit/engine/engine_harness.py): a full
context and its shift, a full slot, deadlines, a failed decode, prompt logprobs in bounded
chunks, input that no longer fits after the reply."""

from __future__ import annotations

import time
from dataclasses import replace

from llmserve.service.config import ContextShiftSettings
from llmserve.service.domain.errors import FailureKind
from llmserve.service.domain.events import FinishReason, SessionFailed, TurnEndEvent
from llmserve.service.domain.requests import OutputParams

from .engine_harness import ListSink, assert_kv_mirrors_slots, make, one_turn, params, run_until, turn_ends
from .fake_runner import BOS


def test_context_full_and_context_shift() -> None:
    executor, _ = make(n_ctx_per_slot=16)
    sink, _ = one_turn(executor, (BOS, 3), params(ignore_eos=True))
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.CONTEXT_FULL
    executor, runner = make(n_ctx_per_slot=16, context_shift=ContextShiftSettings(context_shift=True, keep=1))
    sink, _ = one_turn(executor, (BOS, 3), params(ignore_eos=True, max_tokens=40))
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.LENGTH
    assert executor.metrics.context_shifts._value.get() > 0
    assert_kv_mirrors_slots(executor, runner)


def test_deadline_ends_the_session() -> None:
    executor, _ = make()
    sink = ListSink()
    key = executor.open_session(params(), sink, deadline=time.monotonic() + 0.05)
    executor.add_input(key, (BOS, 3), True)
    time.sleep(0.06)
    run_until(executor, lambda: sink.of(SessionFailed))
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.DEADLINE
    assert sink.of(SessionFailed)[0].kind == FailureKind.DEADLINE
    assert not any(slot.busy for slot, _ in executor.table.slot_states())


def test_failed_decode_fails_only_the_sessions_in_it() -> None:
    executor, runner = make()
    sink = ListSink()
    key = executor.open_session(params(), sink)
    executor.add_input(key, (BOS, 10), True)
    runner.fail_next_decode = True
    run_until(executor, lambda: sink.of(SessionFailed))
    assert sink.of(SessionFailed)[0].kind == FailureKind.INTERNAL
    assert not any(slot.busy for slot, _ in executor.table.slot_states())
    other, _ = one_turn(executor, (BOS, 30), params(max_tokens=2))
    assert other.token_ids() == [31, 32]
    assert_kv_mirrors_slots(executor, runner)


def test_a_full_slot_refuses_the_next_turn_without_growing() -> None:
    executor, runner = make(n_ctx_per_slot=16)
    sink = ListSink()
    key = executor.open_session(params(ignore_eos=True), sink)
    executor.add_input(key, (BOS, 3), True)
    run_until(executor, turn_ends(sink, 1))
    for n in range(2, 12):  # empty turns: nothing more fits
        executor.add_input(key, (), True)
        run_until(executor, turn_ends(sink, n))
    ends = sink.of(TurnEndEvent)
    assert all(e.finish_reason == FinishReason.CONTEXT_FULL for e in ends)
    assert sum(e.completion_tokens for e in ends[1:]) <= len(ends) // 2
    (slot,) = [slot for slot, _ in executor.table.slot_states() if slot.busy]
    assert len(slot.tokens) <= 16 and len(runner.kv[slot.seq_id]) <= 16
    assert_kv_mirrors_slots(executor, runner)


def test_prompt_logprobs_run_in_bounded_chunks() -> None:
    executor, runner = make()
    p = replace(params(max_tokens=2), output=OutputParams(prompt_logprobs=True))
    prompt = (BOS, *range(3, 50))
    sink, _ = one_turn(executor, prompt, p)
    scored = [lp for e in sink.events if hasattr(e, "tokens") for lp in e.tokens]
    assert [lp.token_id for lp in scored] == list(prompt[1:])
    assert runner.max_output_rows <= 32


def test_input_sent_during_a_reply_that_no_longer_fits_ends_context_full() -> None:
    executor, runner = make(n_parallel=1, n_ctx_per_slot=32)
    sink = ListSink()
    key = executor.open_session(params(max_tokens=20, ignore_eos=True), sink)
    executor.add_input(key, (BOS, 10), True)
    for _ in range(3):
        executor.drain(block=False)
        executor.step()
    executor.add_input(key, tuple(range(12, 27)), False)  # 15 tokens: fits now, not after the reply
    run_until(executor, turn_ends(sink))
    executor.add_input(key, (), True)
    run_until(executor, turn_ends(sink, 2))
    assert sink.of(TurnEndEvent)[1].finish_reason == FinishReason.CONTEXT_FULL
    assert len(runner.kv.get(0, [])) <= 32
    assert_kv_mirrors_slots(executor, runner)

"""Sliding-window attention and the prefix cache (issue 14's 600-call finding).

llama.cpp reuses the cells that left a sequence's sliding window, so a long sequence
cut back to a prefix may lack cells its next token attends to. The fake runner drops
those cells after every decode and fails any row whose window is gone; the engine must
prefill such a prefix again instead of trusting its mirror.
"""

from __future__ import annotations

import json

from llmserve.service.domain.events import SessionFailed, TurnEndEvent
from llmserve.service.domain.snapshots import SavedSession
from llmserve.service.engine.executor.executor import Executor

from .engine_harness import ListSink, assert_kv_mirrors_slots, make, one_turn, params, run_until, turn_ends
from .fake_runner import BOS, END_AFTER, EOG, FakeRunner

N_SWA = 8
LONG_PROMPT = (BOS, *range(10, 26))  # 17 tokens; the model then counts on to END_AFTER


def assert_windows_held(executor: Executor, runner: FakeRunner) -> None:
    assert_kv_mirrors_slots(executor, runner)
    for slot, _ in executor.table.slot_states():
        assert runner.holds_window(slot.seq_id, len(slot.tokens)), f"slot {slot.seq_id} lost window cells"


def cold(prompt: tuple[int, ...]) -> tuple[list[int], TurnEndEvent]:
    executor, _ = make(1, n_swa=N_SWA)
    sink, _ = one_turn(executor, prompt, params())
    return sink.token_ids(), sink.of(TurnEndEvent)[0]


def test_a_prefix_of_a_long_sequence_is_prefilled_again() -> None:
    executor, runner = make(1, n_swa=N_SWA)
    _, key = one_turn(executor, LONG_PROMPT, params())
    executor.close(key)
    run_until(executor, lambda: not any(slot.busy for slot, _ in executor.table.slot_states()))
    assert runner.seq_pos_min(0) > 0  # the window moved on: the first cells are gone
    prompt = (*LONG_PROMPT[:12], 30)  # shares 12 cached tokens, but their window is gone
    sink, _ = one_turn(executor, prompt, params())
    assert not sink.of(SessionFailed)
    tokens, end = cold(prompt)
    assert sink.token_ids() == tokens == [*range(31, END_AFTER + 1), EOG]
    assert sink.of(TurnEndEvent)[0].cached_tokens == 0 == end.cached_tokens
    assert_windows_held(executor, runner)


def test_a_repeated_prompt_with_saved_logits_is_prefilled_again() -> None:
    executor, runner = make(1, n_swa=N_SWA)
    first, key = one_turn(executor, LONG_PROMPT, params())
    executor.close(key)
    sink, _ = one_turn(executor, LONG_PROMPT, params())  # ends where the saved logits are
    assert not sink.of(SessionFailed)
    assert sink.token_ids() == first.token_ids()
    assert sink.of(TurnEndEvent)[0].cached_tokens == 0
    assert_windows_held(executor, runner)


def test_a_growing_session_keeps_its_cache() -> None:
    executor, runner = make(1, n_swa=N_SWA)
    sink = ListSink()
    key = executor.open_session(params(max_tokens=4), sink)
    executor.add_input(key, LONG_PROMPT, True)
    run_until(executor, turn_ends(sink, 1))
    executor.add_input(key, (30, 31), True)
    run_until(executor, turn_ends(sink, 2))
    second = sink.of(TurnEndEvent)[1]
    assert second.cached_tokens == len(LONG_PROMPT) + 3  # nothing was cut (the 4th token is not decoded)
    assert sink.token_ids()[4:] == [32, 33, 34, 35]
    assert_windows_held(executor, runner)


def saved(tokens: tuple[int, ...], lowest: int) -> SavedSession:
    state = json.dumps({"tokens": list(tokens), "min": lowest}).encode()
    return SavedSession("s", tokens, (), None, state)


def test_a_saved_state_without_its_window_is_prefilled_again() -> None:
    history = LONG_PROMPT
    for lowest, cached in ((len(history) - N_SWA, len(history)), (len(history) - 2, 0)):
        executor, runner = make(1, n_swa=N_SWA)
        sink = ListSink()
        key = executor.open_session(params(max_tokens=3), sink, restore=saved(history, lowest))
        executor.add_input(key, (30,), True)
        run_until(executor, turn_ends(sink))
        assert not sink.of(SessionFailed)
        assert sink.token_ids() == [31, 32, 33]
        end = sink.of(TurnEndEvent)[0]
        assert end.cached_tokens == cached, f"state from position {lowest}"
        assert_windows_held(executor, runner)

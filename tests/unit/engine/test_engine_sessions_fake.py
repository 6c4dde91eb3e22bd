"""Named sessions in the executor, on the fake runner: restoring a saved session and
saving one the executor ends (see test_engine_fake.py for the harness)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from llmserve.service.domain.errors import FailureKind
from llmserve.service.domain.events import FinishReason, SessionFailed, TurnEndEvent
from llmserve.service.domain.snapshots import SavedSession
from llmserve.service.engine.chat.chat import Conversation

from .engine_harness import ListSink, RecordingStore, assert_kv_mirrors_slots, make, params, run_until, turn_ends
from .fake_runner import BOS


def test_pending_input_is_never_prefilled_past_the_slot() -> None:
    """Found by the 600-call combination run with one KV stream per slot: a named session
    restored with its history and input it had not answered (history + input over the
    slot) had the input prefilled before its turn began, past the slot's cells, and
    llama_decode failed for every sequence in that step. (A unified buffer had hidden it
    in other slots' cells.) The input now waits; its turn ends CONTEXT_FULL."""
    executor, runner = make(n_parallel=1, n_ctx_per_slot=32)
    sink = ListSink()
    history = (BOS, *range(10, 39))  # 30 tokens: fits the slot
    restore = SavedSession("s", history, tuple(range(3, 13)), None, json.dumps({"tokens": list(history), "min": 0}).encode())
    key = executor.open_session(params(max_tokens=4), sink, restore=restore)
    for _ in range(5):
        executor.drain(block=False)
        executor.step()
    assert len(runner.kv.get(0, [])) <= 32
    executor.add_input(key, (), True)
    run_until(executor, turn_ends(sink))
    assert sink.of(TurnEndEvent)[0].finish_reason == FinishReason.CONTEXT_FULL
    assert len(runner.kv.get(0, [])) <= 32
    assert_kv_mirrors_slots(executor, runner)


@pytest.mark.parametrize("end", ["deadline", "shutdown"])
def test_a_session_the_executor_ends_is_saved_with_the_kept_chat(end: str) -> None:
    """Found by the combination fuzzer: a chat session ended by the executor (its deadline;
    a fault or shutdown alike) was saved before the stream's Close carried the
    conversation, so with no chat record, and the next stream's messages were refused."""
    chat = (("user", "Name a colour."), ("assistant", "Red."))
    store = RecordingStore()
    executor, runner = make(2, store=store)
    sink = ListSink()
    named = replace(params(max_tokens=200, ignore_eos=True), session_id="chat-1")
    deadline = time.monotonic() + 0.15 if end == "deadline" else None  # beyond the first steps' deadline margin
    key = executor.open_session(named, sink, deadline, conversation=Conversation(chat))
    executor.add_input(key, (BOS, 3, 4), True)
    for _ in range(3):
        executor.drain(block=False)
        executor.step()
    if end == "deadline":
        time.sleep(0.16)
        run_until(executor, lambda: sink.of(SessionFailed))
    else:
        executor.table.fail_all(FailureKind.SHUTDOWN, "the server is shutting down")
    assert [r.chat for r in store.saved] == [chat]  # type: ignore[attr-defined]
    executor.close(key)  # the stream's close comes after: nothing more happens
    executor.drain(block=False)
    assert len(store.saved) == 1 and not store.settled


def test_a_chat_turn_sent_before_the_restore_matches_the_restored_kv() -> None:
    """Found by the combination fuzzer after the fix above: a restored chat session's whole
    rendering, handled before the session got its slot, was put after the restored history
    (the conversation twice); over the slot, its turn waited forever. Input now waits for
    the restore, and the rendering reuses the restored KV."""
    executor, runner = make(n_parallel=1, n_ctx_per_slot=64)
    sink = ListSink()
    history = (BOS, *range(10, 39))  # 30 tokens in the KV
    restore = SavedSession("s", history, (40,), (("user", "a"), ("assistant", "b")),
                           json.dumps({"tokens": list(history), "min": 0}).encode())
    key = executor.open_session(params(max_tokens=4, ignore_eos=True), sink, restore=restore)
    rendering = (*history, 40, 41, 42, 43, 44)  # the conversation again, with a new message
    executor.add_input(key, rendering, True, replace=True)  # handled in the same drain as the open
    run_until(executor, turn_ends(sink))
    end = sink.of(TurnEndEvent)[0]
    assert end.finish_reason == FinishReason.LENGTH
    assert end.cached_tokens == len(history) and end.prompt_tokens == len(rendering)
    assert runner.kv[0][: len(rendering)] == list(rendering)
    assert_kv_mirrors_slots(executor, runner)

"""The load a replica reports (domain/load.py): the slot-wait term, from executor snapshots."""

from __future__ import annotations

import pytest
from llmserve.service.domain.load import replica_load, slot_wait_s
from llmserve.service.domain.snapshots import ExecutorSnapshot, SlotSnapshot


def _snapshot(num_slots: int, left: tuple[int, ...] = (), waiting: int = 0, step_s: float = 0.05,
              prefill_tokens: int = 0, held: int = 0) -> ExecutorSnapshot:
    """`left`: the generating samples' tokens to go, one slot each; `held`: more busy slots
    whose streams are between turns (admission would preempt them for a new call)."""
    num_busy = len(left) + held
    slots = tuple(SlotSnapshot(i, i < num_busy, 0) for i in range(num_slots))
    return ExecutorSnapshot(slots=slots, num_sessions=num_busy + waiting, num_waiting=waiting,
                            num_prefill_tokens_waiting=prefill_tokens, prompt_token_s=0.003,
                            turn_tokens_left=tuple(sorted(left)), step_s=step_s)


def test_a_free_slot_means_no_wait() -> None:
    assert slot_wait_s(_snapshot(2, left=(200,))) == 0.0


def test_full_slots_wait_for_the_turn_that_ends_first() -> None:
    assert slot_wait_s(_snapshot(2, left=(200, 40))) == pytest.approx(40 * 0.05)


def test_sessions_waiting_ahead_take_the_first_slots_that_free() -> None:
    assert slot_wait_s(_snapshot(2, left=(40, 200), waiting=1)) == pytest.approx(200 * 0.05)
    # more waiting than turns in progress: at least the longest
    assert slot_wait_s(_snapshot(2, left=(40, 200), waiting=5)) == pytest.approx(200 * 0.05)
    # the one free slot goes to the session waiting: the next call waits
    assert slot_wait_s(_snapshot(2, left=(30,), waiting=1)) == pytest.approx(30 * 0.05)


def test_slots_held_between_turns_are_free_for_a_new_call() -> None:
    assert slot_wait_s(_snapshot(2, left=(200,), held=1)) == 0.0
    assert slot_wait_s(_snapshot(2, held=2, waiting=3)) == 0.0  # nothing generating: no turn to wait for


def test_long_replies_report_more_load_than_short_ones_at_the_same_sessions() -> None:
    short = replica_load(_snapshot(2, left=(3, 5)), num_cells=8192, max_queue=4)
    long = replica_load(_snapshot(2, left=(150, 200)), num_cells=8192, max_queue=4)
    free_slot = replica_load(_snapshot(2, left=(150,)), num_cells=8192, max_queue=4)
    assert short.running_sessions == long.running_sessions == 2
    # (2 + 150 x 0.05 s x 2 slots) / (2 + 4)
    assert long.utilization == pytest.approx((2 + 7.5 * 2) / 6)
    assert long.utilization > 5 * short.utilization
    assert free_slot.slot_wait_s == 0.0 and free_slot.utilization == pytest.approx(1 / 6)


def test_prefill_and_slot_wait_add_up() -> None:
    load = replica_load(_snapshot(2, left=(20, 90), prefill_tokens=500), num_cells=8192, max_queue=2)
    assert load.prefill_backlog_s == pytest.approx(1.5)
    assert load.slot_wait_s == pytest.approx(1.0)
    assert load.utilization == pytest.approx((2 + (1.5 + 1.0) * 2) / 4)

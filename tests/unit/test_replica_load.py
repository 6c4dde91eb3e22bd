"""The load a replica reports (domain/load.py): the slot-wait term, from executor snapshots."""

from __future__ import annotations

import pytest
from llmserve.service.domain.load import replica_load, slot_wait_s
from llmserve.service.domain.snapshots import ExecutorSnapshot, SlotSnapshot


def _snapshot(busy: int, free: int, waiting: int = 0, left: tuple[int, ...] = (), step_s: float = 0.05,
              prefill_tokens: int = 0) -> ExecutorSnapshot:
    slots = tuple(SlotSnapshot(i, i < busy, 0) for i in range(busy + free))
    return ExecutorSnapshot(slots=slots, num_sessions=busy + waiting, num_waiting=waiting,
                            num_prefill_tokens_waiting=prefill_tokens, prompt_token_s=0.003,
                            turn_tokens_left=tuple(sorted(left)), step_s=step_s)


def test_a_free_slot_means_no_wait() -> None:
    assert slot_wait_s(_snapshot(busy=1, free=1, left=(200,))) == 0.0


def test_full_slots_wait_for_the_turn_that_ends_first() -> None:
    assert slot_wait_s(_snapshot(busy=2, free=0, left=(200, 40))) == pytest.approx(40 * 0.05)


def test_sessions_waiting_ahead_take_the_first_slots_that_free() -> None:
    assert slot_wait_s(_snapshot(busy=2, free=0, waiting=1, left=(40, 200))) == pytest.approx(200 * 0.05)
    # more waiting than turns known: at least the longest known
    assert slot_wait_s(_snapshot(busy=2, free=0, waiting=5, left=(40, 200))) == pytest.approx(200 * 0.05)
    # a free slot taken by the one waiting session: the next call waits
    assert slot_wait_s(_snapshot(busy=1, free=1, waiting=1, left=(30,))) == pytest.approx(30 * 0.05)


def test_slots_held_between_turns_tell_nothing() -> None:
    assert slot_wait_s(_snapshot(busy=2, free=0, left=())) == 0.0


def test_long_replies_report_more_load_than_short_ones_at_the_same_sessions() -> None:
    short = replica_load(_snapshot(busy=2, free=0, left=(3, 5)), num_cells=8192, max_queue=4)
    long = replica_load(_snapshot(busy=2, free=0, left=(150, 200)), num_cells=8192, max_queue=4)
    idle_slot = replica_load(_snapshot(busy=1, free=1, left=(150,)), num_cells=8192, max_queue=4)
    assert short.running_sessions == long.running_sessions == 2
    # (2 + 150 x 0.05 s x 2 slots) / (2 + 4)
    assert long.utilization == pytest.approx((2 + 7.5 * 2) / 6)
    assert long.utilization > 5 * short.utilization
    assert idle_slot.slot_wait_s == 0.0 and idle_slot.utilization == pytest.approx(1 / 6)


def test_prefill_and_slot_wait_add_up() -> None:
    load = replica_load(_snapshot(busy=2, free=0, left=(20,), prefill_tokens=500), num_cells=8192, max_queue=2)
    assert load.prefill_backlog_s == pytest.approx(1.5)
    assert load.slot_wait_s == pytest.approx(1.0)
    assert load.utilization == pytest.approx((2 + (1.5 + 1.0) * 2) / 4)

"""One KV stream per slot: llama.cpp's ubatch split (split_equal, sequential; modelled in
tests/unit/engine/fake_runner.py) and the rules that keep steps in few ubatches and drafts
window-safe (pure, and end to end on the fake runner)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from llmserve.service.config import PrefillSettings, SpeculationSettings
from llmserve.service.domain.events import TurnEndEvent
from llmserve.service.engine.executor.allocator import SlotAllocator, min_scattered_reuse
from llmserve.service.engine.executor.executor import Executor
from llmserve.service.engine.executor.scheduler import PlannerState, Scheduler, SeqDemand, StepPlan

from .engine_harness import ListSink, assert_kv_mirrors_slots, make, one_turn, params, run_until, turn_ends
from .fake_runner import BOS, FakeRunner, split_equal

SCATTERED = min_scattered_reuse(FakeRunner.costs, 1000)


def split_rows(rows: list[tuple[int, int]], n_ubatch: int) -> list[list[tuple[int, int]]]:
    return [[rows[i] for i in ubatch] for ubatch in split_equal(rows, n_ubatch)]


def batch_rows(plan: StepPlan, demands: dict[int, SeqDemand], positions: dict[int, int]) -> list[tuple[int, int]]:
    """The rows GenerationStep builds for `plan` with one stream per slot (sequence-id order)."""
    drafts = dict(plan.drafts)
    keyed = [(key, 1 + drafts.get(key, 0)) for key in plan.decode] + list(plan.prefill)
    rows: list[tuple[int, int]] = []
    for key, n in sorted(keyed, key=lambda row: demands[row[0]].seq_id):
        seq = demands[key].seq_id
        rows += [(seq, positions[seq] + j) for j in range(n)]
    return rows


demand_lists = st.lists(
    st.tuples(st.integers(0, 7), st.booleans(), st.integers(1, 40), st.integers(0, 16), st.booleans()),
    min_size=1, max_size=6, unique_by=lambda t: t[0],
)


@settings(max_examples=400, deadline=None)
@given(demand_lists, st.sampled_from([8, 16, 64, 512]))
def test_a_granted_draft_never_starts_a_later_ubatch_past_its_first_draft_row(raw, n_ubatch) -> None:
    # The rejected-draft hazard: a ubatch holding a sequence's rows from position a on frees
    # that sequence's cells up to a - n_swa. After rejecting every draft the next token sits
    # at n + 1 and needs n + 2 - n_swa on, so no ubatch may start its rows past n + 1.
    demands = {
        key: SeqDemand(key, decoding, 0 if decoding else num_prefill, num_draft if decoding else 0, seq_id=key,
                       window_at_risk=True)
        for key, decoding, num_prefill, num_draft, _ in raw
    }
    positions = {key: 600 for key in demands}
    scheduler = Scheduler(512, n_ubatch, 4, prefill_budget=None, max_draft_rows=16, per_slot_streams=True, costs=FakeRunner.costs)
    plan = scheduler.plan(list(demands.values()), [])
    rows = batch_rows(plan, demands, positions)
    for key, _ in plan.drafts:
        seq = demands[key].seq_id
        starts = [min(pos for s, pos in ub if s == seq) for ub in split_rows(rows, n_ubatch) if any(s == seq for s, _ in ub)]
        assert all(a <= positions[seq] + 1 for a in starts), (plan, starts)


DUE = PlannerState(decode_held=True)


def test_a_neighbours_prompt_holds_a_long_sequences_draft_back_but_not_a_far_ones() -> None:
    # 7 draft rows: with the decode row a multiple of four (step_costs), all of a lone stream's;
    # the decode rows are due (held back the step before: prompts_first.py), so they go now
    scheduler = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=16, per_slot_streams=True, costs=FakeRunner.costs)
    near = scheduler.plan([SeqDemand(1, True, 0, 7, seq_id=3, window_at_risk=True, draft_acceptance=0.99, draft_odds=0.99), SeqDemand(2, False, 100, seq_id=4)], [], state=DUE)
    assert near.drafts == () and near.prefill == ((2, 100),)  # the prompt goes on, the draft waits
    short = scheduler.plan([SeqDemand(1, True, 0, 7, seq_id=3, draft_acceptance=0.99, draft_odds=0.99), SeqDemand(2, False, 100, seq_id=4)], [], state=DUE)
    assert short.drafts == ((1, 7),)  # a sequence shorter than the window loses no cell
    far = scheduler.plan([SeqDemand(1, True, 0, 7, seq_id=3, window_at_risk=True, draft_acceptance=0.99, draft_odds=0.99), SeqDemand(2, False, 100, seq_id=5)], [], state=DUE)
    assert far.drafts == ((1, 7),)
    unified = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=16, costs=FakeRunner.costs)
    assert unified.plan([SeqDemand(1, True, 0, 7, seq_id=3, window_at_risk=True, draft_acceptance=0.99, draft_odds=0.99), SeqDemand(2, False, 100, seq_id=4)],
                        []).drafts == ((1, 7),)  # one buffer: drafts lead the batch, in its first ubatch


def test_busy_slots_stay_together_so_a_decode_step_is_one_ubatch() -> None:
    busy_ids = []
    for together in (True, False):
        alloc = SlotAllocator(num_slots=8, n_ctx_per_slot=100, min_scattered_reuse=SCATTERED if together else None)
        slots = [alloc.allocate([]) for _ in range(8)]
        for seq_id in (4, 0, 6, 2, 7, 1, 5, 3):  # least recently used first: 4, 0, 6, ...
            slots[seq_id].append([100 + seq_id])  # no prefix anyone will share
            alloc.free(slots[seq_id])
        busy_ids.append(sorted(alloc.allocate([1]).seq_id for _ in range(3)))
    assert busy_ids == [[4, 5, 6], [0, 4, 6]]  # next to a busy slot, else LRU; plain LRU scatters
    assert [len(split_equal([(i, 0) for i in ids], 512)) for ids in busy_ids] == [1, 3]  # ubatches of a decode step


def test_while_sequences_decode_a_step_carries_at_most_two_prompts() -> None:
    # Each prompt chunk past the decode rows' ubatch is a ubatch of its own (a pass over
    # every weight): five short prompts arriving at once go two per step, oldest first.
    per_slot = Scheduler(512, 512, 4, prefill_budget=256, per_slot_streams=True)
    decoding = [SeqDemand(k, True, 0, seq_id=k) for k in range(10, 15)]
    demands = [*decoding, *(SeqDemand(k, False, 20, seq_id=k) for k in range(1, 6))]
    plan = per_slot.plan(demands, [])
    assert [key for key, _ in plan.prefill] == [1, 2] and dict(plan.prefill) == {1: 20, 2: 20}
    alone = per_slot.plan(demands[5:], [], state=plan.next_state)  # nothing decodes: every prompt, all of -b
    assert len(alone.prefill) == 5
    burst = per_slot.plan(demands[4:], [], state=alone.next_state)  # five prompts behind one stream: as many as fit
    assert len(burst.prefill) == 5
    unified = Scheduler(512, 512, 4, prefill_budget=256)
    assert len(unified.plan(demands, []).prefill) == 5  # one ubatch holds them all


def test_a_new_session_fills_the_hole_a_finished_one_left() -> None:
    alloc = SlotAllocator(num_slots=8, n_ctx_per_slot=100, min_scattered_reuse=SCATTERED)
    slots = [alloc.allocate([]) for _ in range(5)]  # 0..4 busy
    alloc.free(slots[2])  # the most recently used idle slot, between two busy ones
    assert alloc.allocate([7]).seq_id == 2  # not LRU slot 5: 0..4 stay one run


def pool_ubatches(together: bool, num_slots: int = 16, concurrency: int = 8, num_requests: int = 200) -> list[int]:
    """Issue 41's pool workload on the allocator alone: `concurrency` callers, each taking the next
    request when one ends (in a random order); prompts are one of 8 sentences and differ at the
    end. The ubatches of a decode step over the busy slots, after each arrival."""
    rng = random.Random(7)
    alloc = SlotAllocator(num_slots=num_slots, n_ctx_per_slot=200, min_scattered_reuse=SCATTERED if together else None)
    busy = []
    counts = []
    for i in range(concurrency + num_requests):
        if len(busy) == concurrency:
            done = busy.pop(rng.randrange(len(busy)))
            done.append([3000 + i] * 5)  # its reply
            alloc.free(done)
        prompt = [*range(1000 + 100 * (i % 8), 1012 + 100 * (i % 8)), 2000 + i % 97, 2100 + i]
        slot = alloc.allocate(prompt)
        slot.match(prompt)
        slot.take_stale_tail()
        slot.append(prompt[slot.num_confirmed:])
        busy.append(slot)
        counts.append(len(split_equal([(s.seq_id, 0) for s in sorted(busy, key=lambda s: s.seq_id)], 512)))
    return counts[concurrency:]


def test_prompts_sharing_a_head_keep_busy_slots_together() -> None:
    # The cause of issue 41's slowdown under the pool workload: a new session took the idle
    # slot holding the longest prefix of its prompt (the same sentence) wherever it was, so
    # busy slots scattered over all 16 and a decode step of 8 rows ran as several ubatches
    together, scattered = pool_ubatches(True), pool_ubatches(False)
    assert max(together) == 1
    assert sum(scattered) / len(scattered) > 3  # the rule without neighbours, as before: 4.2


def test_a_slot_holding_the_whole_prompt_wins_over_busy_neighbours() -> None:
    alloc = SlotAllocator(num_slots=4, n_ctx_per_slot=100, min_scattered_reuse=SCATTERED)
    slots = [alloc.allocate([]) for _ in range(4)]
    prompt = list(range(10, 30))
    slots[3].append(prompt)
    slots[1].append(prompt[:-2])  # all but the prompt's last two tokens, between busy 0 and 2
    alloc.free(slots[3])
    alloc.free(slots[1])
    assert alloc.allocate(prompt).seq_id == 3  # a repeated request lands where it ran, saved logits and all


def test_a_far_prefix_is_reused_only_when_it_saves_more_than_a_scattered_slot_costs() -> None:
    assert 100 < SCATTERED < 400  # by llama.cpp's CPU step costs: ~190 prompt tokens
    for cached, expected in ((SCATTERED - 20, 4), (SCATTERED + 20, 6)):
        alloc = SlotAllocator(num_slots=8, n_ctx_per_slot=1000, min_scattered_reuse=SCATTERED)
        slots = [alloc.allocate([]) for _ in range(8)]
        prompt = list(range(100, 100 + cached + 10))
        slots[6].append(prompt[:cached])
        for slot in slots[4:]:
            alloc.free(slot)  # 0..3 busy; 6 holds `cached` tokens of the prompt, away from them
        assert alloc.allocate(prompt).seq_id == expected


HEAD = (BOS, *range(40, 52))  # a shared 13-token head (a system prompt)


def test_a_far_cached_head_is_copied_into_the_slot_next_to_the_busy_ones() -> None:
    executor, runner = make(4, speculation=SpeculationSettings(spec_type="none"))
    sinks = [ListSink() for _ in range(4)]
    keys = [executor.open_session(params(max_tokens=40 if i == 1 else 2, ignore_eos=True), sink)
            for i, sink in enumerate(sinks)]
    for i, key in enumerate(keys[:3]):
        executor.add_input(key, (BOS, 70 + i, 71 + i), True)
    executor.drain(block=False)
    executor.step()  # the head comes a step later: not seated by length beside the others
    executor.add_input(keys[3], (*HEAD, 63), True)
    run_until(executor, lambda: all(turn_ends(sinks[i])() for i in (0, 2, 3)))
    seq_ids = {key: executor.table.sessions[key].main.slot.seq_id for key in keys}
    assert sorted(seq_ids.values()) == [0, 1, 2, 3] and seq_ids[keys[3]] == 3  # the head sits in slot 3
    for i in (0, 2, 3):
        executor.close(keys[i])
    executor.drain(block=False)  # 1 decodes on; 0 and 2 are next to it, 3 is not
    sink = ListSink()
    key = executor.open_session(params(max_tokens=3, ignore_eos=True), sink)
    executor.add_input(key, (*HEAD, 99), True)
    run_until(executor, turn_ends(sink))
    assert executor.table.sessions[key].main.slot.seq_id in (0, 2)  # busy ids stay one run
    end = sink.of(TurnEndEvent)[-1]
    assert end.cached_tokens == len(HEAD)  # the head came with the copy, not prefilled again
    alone, _ = one_turn(make(4, speculation=SpeculationSettings(spec_type="none"))[0], (*HEAD, 99),
                        params(max_tokens=3, ignore_eos=True))
    assert sink.token_ids() == alone.token_ids()
    assert_kv_mirrors_slots(executor, runner)


# A long sequence (past the fake's 8-token window) whose first draft is rejected at once
# (the n-gram (30, 31) drafts 50, 51, ...; the model says 32), in the step where its
# neighbour's prompt chunk would share the ubatch: split that way, the draft's tail ubatch
# would free a cell the next token needs (the fake fails any such row).
LONG_A = (BOS, 30, 31, 50, 51, 52, 53, 54, 55, 30)
LONG_B = (BOS, *(3 + i % 25 for i in range(59)))


def run_pair(spec: SpeculationSettings, guard: bool = True) -> tuple[list[int], list[int], FakeRunner, Executor]:
    # price_drafts=False: the window rule, whatever rows would cost
    executor, runner = make(2, n_swa=8, prefill=PrefillSettings(prefill_budget=3), speculation=spec, price_drafts=False)
    executor.scheduler.per_slot_streams = guard  # False: rows still in id order, drafts not held back
    sinks = [ListSink(), ListSink()]
    for sink, prompt in zip(sinks, (LONG_A, LONG_B)):
        executor.add_input(executor.open_session(params(max_tokens=6, ignore_eos=True), sink), prompt, True)
    run_until(executor, lambda: all(turn_ends(s)() for s in sinks))
    assert_kv_mirrors_slots(executor, runner)
    return sinks[0].token_ids(), sinks[1].token_ids(), runner, executor


SPEC_LONG = SpeculationSettings(spec_type="ngram-simple", draft_max=8, spec_ngram_size_n=2)


def test_a_long_sequence_next_to_a_prefilling_one_drafts_without_losing_window_cells() -> None:
    plain_a, plain_b, _, _ = run_pair(SpeculationSettings(spec_type="none"))
    spec_a, spec_b, runner, executor = run_pair(SPEC_LONG)
    assert (spec_a, spec_b) == (plain_a, plain_b) and spec_a == list(range(31, 37))
    for slot, _ in executor.table.slot_states():
        assert runner.holds_window(slot.seq_id, len(slot.tokens))


def test_without_the_rule_that_draft_loses_a_window_cell() -> None:
    try:
        run_pair(SPEC_LONG, guard=False)
    except AssertionError as exc:
        assert "attends to cells already dropped" in str(exc)
    else:
        raise AssertionError("the split draft kept its window: the scenario no longer tests the rule")


def burst(seat: bool) -> tuple[int, list[list[int]], list[int]]:
    """Six prompts of 12 and 6 tokens, alternately, arriving before one step on an idle server:
    that step's ubatches, each session's reply and the slots they ended on."""
    executor, runner = make(n_parallel=6, speculation=SpeculationSettings(spec_type="none"))
    if not seat:
        executor.generation.seat_by_length = lambda plan, samples: None  # type: ignore[method-assign]
    sinks = [ListSink() for _ in range(6)]
    keys = [executor.open_session(params(max_tokens=4), sink) for sink in sinks]
    for i, key in enumerate(keys):
        executor.add_input(key, (BOS, *range(100 + 20 * i, 100 + 20 * i + (11 if i % 2 == 0 else 5))), True)
    executor.drain(block=False)
    executor.step()
    ubatches = executor.profile.ubatches
    slots = [executor.table.samples[key].slot.seq_id for key in keys]  # type: ignore[union-attr]
    run_until(executor, lambda: all(turn_ends(sink)() for sink in sinks))
    assert_kv_mirrors_slots(executor, runner)
    return ubatches, [sink.token_ids() for sink in sinks], slots


def test_a_burst_of_prompts_takes_sequence_ids_by_length_so_its_step_is_fewer_ubatches() -> None:
    # split_equal: 12, 6, 12, 6, 12, 6 on ids 0..5 is 6 x 6 tokens, then 0, 2 and 4 one ubatch
    # each; in length order (12, 12, 12, 6, 6, 6) the rest of 0..2 is one.
    seated, replies, slots = burst(True)
    scattered, replies_scattered, slots_scattered = burst(False)
    assert (seated, scattered) == (2, 4)
    assert sorted(slots[0::2]) == [0, 1, 2] and slots_scattered == [0, 1, 2, 3, 4, 5]
    assert replies == replies_scattered  # each reply is its own prompt's, on whichever slot

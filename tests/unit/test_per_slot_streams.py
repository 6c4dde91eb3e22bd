"""One KV stream per slot: llama.cpp's ubatch split (split_equal, sequential) modelled in
Python, and the rules that keep steps in few ubatches and drafts window-safe (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from llmserve.service.engine.allocator import SlotAllocator
from llmserve.service.engine.scheduler import Scheduler, SeqDemand, StepPlan


def split_equal(rows: list[tuple[int, int]], n_ubatch: int) -> list[list[tuple[int, int]]]:
    """llama_batch_allocr::split_equal(n_ubatch, sequential=true) over (seq_id, pos) rows:
    each ubatch takes, from the first unused row on, sequences whose ids follow one
    another (in batch order) and the same number of rows of each."""
    used = [False] * len(rows)
    ubatches: list[list[tuple[int, int]]] = []
    while not all(used):
        run: list[int] = []
        for i, (seq, _) in enumerate(rows):
            if not used[i] and seq not in run and (not run or seq == run[-1] + 1):
                run.append(seq)
        todo = {seq: [i for i, (s, _) in enumerate(rows) if s == seq and not used[i]] for seq in run}
        ubatch: list[int] = []
        depth = 0
        while all(depth < len(todo[seq]) for seq in run):
            ubatch += [todo[seq][depth] for seq in run]
            depth += 1
            if (depth + 1) * len(run) > n_ubatch:
                break
        for i in ubatch:
            used[i] = True
        ubatches.append([rows[i] for i in ubatch])
    return ubatches


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
    scheduler = Scheduler(512, n_ubatch, 4, prefill_budget=None, max_draft_rows=16, per_slot_streams=True)
    plan = scheduler.plan(list(demands.values()), [])
    rows = batch_rows(plan, demands, positions)
    for key, _ in plan.drafts:
        seq = demands[key].seq_id
        starts = [min(pos for s, pos in ub if s == seq) for ub in split_equal(rows, n_ubatch) if any(s == seq for s, _ in ub)]
        assert all(a <= positions[seq] + 1 for a in starts), (plan, starts)


def test_a_neighbours_prompt_holds_a_long_sequences_draft_back_but_not_a_far_ones() -> None:
    scheduler = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=16, per_slot_streams=True)
    near = scheduler.plan([SeqDemand(1, True, 0, 8, seq_id=3, window_at_risk=True), SeqDemand(2, False, 100, seq_id=4)], [])
    assert near.drafts == () and near.prefill == ((2, 100),)  # the prompt goes on, the draft waits
    short = scheduler.plan([SeqDemand(1, True, 0, 8, seq_id=3), SeqDemand(2, False, 100, seq_id=4)], [])
    assert short.drafts == ((1, 8),)  # a sequence shorter than the window loses no cell
    far = scheduler.plan([SeqDemand(1, True, 0, 8, seq_id=3, window_at_risk=True), SeqDemand(2, False, 100, seq_id=5)], [])
    assert far.drafts == ((1, 8),)
    unified = Scheduler(512, 512, 4, prefill_budget=None, max_draft_rows=16)
    assert unified.plan([SeqDemand(1, True, 0, 8, seq_id=3, window_at_risk=True), SeqDemand(2, False, 100, seq_id=4)],
                        []).drafts == ((1, 8),)  # one buffer: drafts lead the batch, in its first ubatch


def test_busy_slots_stay_together_so_a_decode_step_is_one_ubatch() -> None:
    busy_ids = []
    for together in (True, False):
        alloc = SlotAllocator(num_slots=8, max_tokens_per_slot=100, keep_busy_together=together)
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
    alone = per_slot.plan(demands[5:], [])  # nothing decodes: every prompt, all of -b
    assert len(alone.prefill) == 5
    burst = per_slot.plan(demands[4:], [])  # five prompts behind one stream: as many as fit
    assert len(burst.prefill) == 5
    unified = Scheduler(512, 512, 4, prefill_budget=256)
    assert len(unified.plan(demands, []).prefill) == 5  # one ubatch holds them all


def test_a_new_session_fills_the_hole_a_finished_one_left() -> None:
    alloc = SlotAllocator(num_slots=8, max_tokens_per_slot=100, keep_busy_together=True)
    slots = [alloc.allocate([]) for _ in range(5)]  # 0..4 busy
    alloc.free(slots[2])  # the most recently used idle slot, between two busy ones
    assert alloc.allocate([7]).seq_id == 2  # not LRU slot 5: 0..4 stay one run

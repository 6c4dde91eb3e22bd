"""Slot allocator: prefix reuse, LRU, trimming (pure, no llama_cpp)."""

from llmserve.service.engine.executor.allocator import SlotAllocator, common_prefix_length


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5, 6], [5, 6]) == 2


def test_allocate_until_full_then_free() -> None:
    alloc = SlotAllocator(num_slots=2, n_ctx_per_slot=100)
    a = alloc.allocate([1, 2])
    b = alloc.allocate([3, 4])
    assert {a.seq_id, b.seq_id} == {0, 1}
    assert not alloc.can_allocate()
    assert alloc.num_busy == 2
    alloc.free(a)
    assert alloc.can_allocate()
    assert alloc.allocate([9]).seq_id == a.seq_id


def test_longest_common_prefix_wins_over_lru() -> None:
    alloc = SlotAllocator(num_slots=3, n_ctx_per_slot=100)
    slots = [alloc.allocate([]) for _ in range(3)]
    for slot, tokens in zip(slots, ([1, 2, 3, 4], [1, 2, 9], [7, 7])):
        slot.append(tokens)
        alloc.free(slot)
    chosen = alloc.allocate([1, 2, 3, 5])
    assert chosen.seq_id == slots[0].seq_id
    assert chosen.match([1, 2, 3, 5]) == 3
    assert chosen.take_stale_tail() == 3  # the caller trims KV from position 3
    assert chosen.tokens == [1, 2, 3]


def test_no_common_prefix_takes_least_recently_used() -> None:
    alloc = SlotAllocator(num_slots=2, n_ctx_per_slot=100)
    first, second = alloc.allocate([]), alloc.allocate([])
    first.append([1])
    second.append([2])
    alloc.free(first)
    alloc.free(second)
    assert alloc.allocate([3]).seq_id == first.seq_id


def test_incremental_match_and_unconfirm() -> None:
    alloc = SlotAllocator(num_slots=1, n_ctx_per_slot=100)
    slot = alloc.allocate([])
    slot.append([1, 2, 3, 4])
    alloc.free(slot)
    slot = alloc.allocate([1, 2])
    assert slot.match([1, 2]) == 2
    assert slot.match([3, 4]) == 2  # input arriving later still hits the cache
    assert slot.num_confirmed == 4
    assert slot.take_stale_tail() is None
    assert slot.unconfirm_last() == 4  # re-decode the last token for its logits
    assert slot.take_stale_tail() == 3


def test_free_keeps_tokens_as_prefix_cache() -> None:
    alloc = SlotAllocator(num_slots=1, n_ctx_per_slot=100)
    slot = alloc.allocate([])
    slot.append([5, 6, 7])
    alloc.free(slot)
    assert not slot.busy
    assert alloc.num_cached_tokens == 3


def test_saved_logits_survive_only_while_their_position_is_cached() -> None:
    alloc = SlotAllocator(num_slots=1, n_ctx_per_slot=100)
    slot = alloc.allocate([])
    slot.append([1, 2, 3, 4, 5])
    slot.save_logits(2, "row-at-2")
    assert slot.logits_at(2) == "row-at-2" and slot.logits_at(4) is None
    alloc.free(slot)
    slot = alloc.allocate([1, 2, 3])
    assert slot.match([1, 2, 3]) == 3
    assert slot.take_stale_tail() == 3  # trims positions 3.. : position 2 stays
    assert slot.logits_at(2) == "row-at-2"
    slot.num_confirmed = 2
    slot.take_stale_tail()
    assert slot.logits_at(2) is None

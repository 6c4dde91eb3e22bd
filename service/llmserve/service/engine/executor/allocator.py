"""KV slot allocator: maps sessions to llama.cpp sequence ids (pure, no llama_cpp).

Each of the `num_slots` slots is one sequence id of the KV cache (one stream per
slot, or one unified buffer) and holds at most `n_ctx_per_slot` cells, so all slots together never
need more cells than the context has: a decode never fails for lack of room.

A slot whose session ended stays *idle* with its tokens still in the KV: a
prefix cache. `allocate` gives a new session the idle slot whose tokens share
the longest prefix with the session's input (else the least recently used one);
the caller then confirms the shared prefix with `Slot.match` and removes the
stale tail from the KV (`llama_memory_seq_rm`) with `Slot.take_stale_tail`
right before prefilling.

Called only from the executor thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...domain.requests import AdapterSet
from ..runner_api import StepCosts
from .canonical_chunks import MAX_CANONICAL_CHUNK, is_canonical, reusable


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    """One sequence id. `tokens` mirrors exactly what the KV holds for it.

    `num_confirmed` is how many of `tokens` belong to the current session's
    history; the rest is cached tail from an earlier session that may still be
    matched by input that has not arrived yet.
    """

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    num_confirmed: int = 0
    busy: bool = False
    last_used: int = 0
    # The logits row a prompt ended with, and its position: a later prompt that ends
    # at the same place samples from it instead of decoding its last token again (a
    # lone re-decode takes other kernel paths, and a repeated seeded request would not
    # repeat exactly).
    saved_logits: Any = None
    saved_logits_at: int = -1
    shifted: bool = False  # a context shift moved positions: the KV is no prefix cache
    adapters: AdapterSet = ()  # the LoRA adapters `tokens` were computed under (their KV differs by adapter)
    foreign: bool = False  # `tokens` were computed under other adapters than the session's: none is matched
    num_canonical: int = 0  # leading tokens computed as whole canonical chunks, each alone (canonical_chunks.py)
    base_until: int | None = None  # cells from here on were computed under an aLoRA: no prefix for others

    def cap(self, num_matched: int) -> int:
        """A prefix match, up to the first aLoRA cell (`base_until`): no prefix for others past it."""
        return num_matched if self.base_until is None else min(num_matched, self.base_until)

    def claim(self, adapters: AdapterSet) -> None:
        """A session under `adapters` takes the slot: a KV computed under another set is no
        prefix of its input (the stale tail trim then cuts all of it)."""
        if adapters != self.adapters:
            self.num_confirmed = 0
            self.foreign = bool(self.tokens)
            self.adapters, self.base_until = adapters, None
            self.save_logits(-1, None)

    def shift(self, keep: int, discard: int) -> None:
        """Mirror a context shift: tokens [keep, keep+discard) left the KV."""
        assert len(self.tokens) == self.num_confirmed
        del self.tokens[keep : keep + discard]
        self.num_confirmed = len(self.tokens)
        self.save_logits(-1, None)
        self.shifted = True
        self.num_canonical = 0

    def save_logits(self, position: int, logits: Any) -> None:
        self.saved_logits, self.saved_logits_at = logits, position

    def logits_at(self, position: int) -> Any:
        return self.saved_logits if self.saved_logits_at == position else None

    def match(self, new_tokens: Sequence[int], canonical_chunk: int | None = None) -> int:
        """Confirm as many leading `new_tokens` as the cached tail already holds; for a
        deterministic sample (`canonical_chunk`), only up to a whole canonical chunk that ends
        before the last of `new_tokens` (canonical_chunks.py)."""
        if self.foreign:
            return 0
        tail = self.tokens[self.num_confirmed : self.base_until]
        n = common_prefix_length(tail, new_tokens)
        if canonical_chunk is not None:
            n = reusable(self.num_canonical, self.num_confirmed, min(n, len(new_tokens) - 1), canonical_chunk)
        self.num_confirmed += n
        return n

    def take_stale_tail(self) -> int | None:
        """Forget unconfirmed cells; returns the position to trim from, or None."""
        if len(self.tokens) == self.num_confirmed:
            return None
        self.foreign = False
        del self.tokens[self.num_confirmed :]
        self.num_canonical = min(self.num_canonical, self.num_confirmed)
        self.base_until = self.base_until if self.base_until is not None and self.base_until < self.num_confirmed else None
        if self.saved_logits_at >= self.num_confirmed:
            self.save_logits(-1, None)
        return self.num_confirmed

    def unconfirm_last(self) -> int:
        """Give back the last confirmed token so it can be decoded again for logits."""
        self.num_confirmed -= 1
        return self.tokens[self.num_confirmed]

    def append(self, tokens: Sequence[int], canonical_chunk: int | None = None, adapter_cells: bool = False) -> None:
        """Record tokens just decoded into the KV (the tail must be trimmed first);
        `canonical_chunk`: they were a deterministic sample's prompt chunk, decoded alone;
        `adapter_cells`: an aLoRA's (`base_until` then marks the first of them)."""
        assert len(self.tokens) == self.num_confirmed, "trim the stale tail first"
        if adapter_cells and self.base_until is None:
            self.base_until = len(self.tokens)
        if canonical_chunk is not None and is_canonical(self.num_canonical, len(self.tokens), len(tokens), canonical_chunk):
            self.num_canonical += len(tokens)
        self.tokens.extend(tokens)
        self.num_confirmed = len(self.tokens)

    def reset(self) -> None:
        """The KV lost this sequence (failed trim or decode): nothing is cached."""
        self.tokens.clear()
        self.num_confirmed = 0
        self.foreign, self.base_until = False, None
        self.num_canonical = 0
        self.save_logits(-1, None)


MIN_PREFIX_REUSE = 8
# A copy of a slot's KV moves every cell of its stream; one cell's K and V are a few tens of
# KB, which memory moves in microseconds, while prefilling one token takes a large fraction
# of a millisecond: a copy pays when it saves at least one token per this many cells
COPY_CELLS_PER_TOKEN = 128
# The decode steps of a session that the slot choice weighs against a prefix (a short reply:
# the 64 tokens of loadgen's workloads); a longer one only makes a scattered slot cost more
SCATTER_STEPS = 64


def min_scattered_reuse(costs: StepCosts, max_tokens: int) -> int:
    """The fewest prompt tokens worth reusing in a slot away from the busy ones, by `costs`:
    prefilling them (a ubatch of that many rows) costs what SCATTER_STEPS decode steps cost
    when each is split into one more ubatch of one row (`SlotAllocator`)."""
    penalty = SCATTER_STEPS * costs.step_cost(1)
    return next((m for m in range(1, max_tokens + 1) if costs.prefill_cost(m) >= penalty), max_tokens + 1)


class SlotAllocator:
    """Hands out sequence ids 0..num_slots-1 to sessions; idle slots cache prefixes."""

    def __init__(
        self, num_slots: int, n_ctx_per_slot: int, min_prefix_reuse: int = MIN_PREFIX_REUSE,
        min_scattered_reuse: int | None = None, canonical_chunk: int = MAX_CANONICAL_CHUNK,
    ) -> None:
        """`min_scattered_reuse`, with one KV stream per slot (None: one buffer): busy sequence ids
        are kept in runs, as each run of consecutive ids is one ubatch of a decode step and
        each ubatch a pass over every weight. A session takes an idle slot next to a busy one
        (a hole between two first) unless a slot elsewhere holds at least this many more
        tokens of its prompt: a prefix shorter than that is cheaper to prefill once than a
        decode step split in two for the rest of the session (`allocate`). `canonical_chunk`: what
        deterministic samples compute their KV in (canonical_chunks.py)."""
        if num_slots < 1 or n_ctx_per_slot < 2:
            raise ValueError("need at least one slot of at least two tokens")
        self.n_ctx_per_slot = n_ctx_per_slot
        self.canonical_chunk = canonical_chunk
        self.min_prefix_reuse = min_prefix_reuse
        self.min_scattered_reuse = min_scattered_reuse
        self.slots = [Slot(seq_id=i) for i in range(num_slots)]
        self._clock = 0

    @property
    def keep_busy_together(self) -> bool:
        return self.min_scattered_reuse is not None

    @property
    def num_busy(self) -> int:
        return sum(slot.busy for slot in self.slots)

    @property
    def num_cached_tokens(self) -> int:
        return sum(len(slot.tokens) for slot in self.slots)

    @property
    def num_idle(self) -> int:
        return sum(not slot.busy for slot in self.slots)

    def can_allocate(self) -> bool:
        return any(not slot.busy for slot in self.slots)

    def allocate(self, prompt: Sequence[int], adapters: AdapterSet = ()) -> Slot:
        """Take an idle slot for a session whose input starts with `prompt`, decoded under
        `adapters` (only a prefix cached under the same adapters is reused).

        1. A slot holding the whole prompt: a repeated request lands where it ran last time,
           with the same saved logits (the most recently used of such slots).
        2. With busy ids kept in runs: only the slots with the most busy neighbours, unless a
           slot with fewer reuses `min_scattered_reuse` tokens more (`_together`).
        3. The longest reusable prefix, then the most busy neighbours, then the most recently
           used slot (with a prefix) or the least recently used (without one).

        A shared prefix shorter than `min_prefix_reuse` tokens (say, just BOS) does not
        count: it saves nothing, and recomputing the whole prompt keeps its numerics the
        same as on a cold server (llama.cpp's kernels round differently with batch shape).
        """
        idle = [slot for slot in self.slots if not slot.busy]
        if not idle:
            raise RuntimeError("no idle slot: check can_allocate() first")
        reuse = {s.seq_id: self._reused(s, prompt, adapters) for s in idle}
        whole = [s for s in idle if reuse[s.seq_id] == len(prompt) > 0]
        if whole:
            best = max(whole, key=lambda s: s.last_used)
        else:
            best = max(self._together(idle, reuse), key=lambda s: (
                reuse[s.seq_id], self._busy_neighbours(s), s.last_used if reuse[s.seq_id] else -s.last_used))
        best.busy = True
        best.num_confirmed = 0
        best.claim(adapters)
        self._touch(best)
        return best

    def donor_for(self, slot: Slot, prompt: Sequence[int]) -> Slot | None:
        """An idle slot whose KV is worth copying into `slot` (just taken for `prompt`, next
        to busy ones): it holds at least `min_prefix_reuse` more tokens of the prompt, and at
        least one per COPY_CELLS_PER_TOKEN cells of a slot (llama.cpp copies a slot's whole
        stream between streams, every cell of it). None with one KV buffer, where the
        allocator itself took the slot with the longest prefix."""
        if not self.keep_busy_together:
            return None
        idle = [s for s in self.slots if not s.busy]
        donor = max(idle, key=lambda s: (self._reused(s, prompt, slot.adapters), s.last_used), default=None)
        min_gain = max(self.min_prefix_reuse, self.n_ctx_per_slot // COPY_CELLS_PER_TOKEN)
        if donor is None or self._reused(donor, prompt, slot.adapters) < self._reused(slot, prompt, slot.adapters) + min_gain:
            return None
        return donor

    def _reused(self, slot: Slot, prompt: Sequence[int], adapters: AdapterSet) -> int:
        """The tokens of `prompt` that `slot` would save prefilling under `adapters` (0 when
        not worth reusing, or cached under other adapters)."""
        if slot.adapters != adapters or slot.foreign:
            return 0
        num_matched = slot.cap(common_prefix_length(slot.tokens, prompt))
        return num_matched if self.reusable(num_matched, len(prompt)) else 0

    def _together(self, idle: list[Slot], reuse: dict[int, int]) -> list[Slot]:
        """The idle slots a session may take so busy ids stay in runs: those with the most busy
        neighbours (a hole first, then a run's end) unless a slot with fewer saves
        `min_scattered_reuse` tokens more (all of `idle` with one KV buffer)."""
        if self.min_scattered_reuse is None:
            return idle
        longest = max(reuse.values())
        for num_neighbours in (2, 1):
            tier = [s for s in idle if self._busy_neighbours(s) == num_neighbours]
            if tier and longest - max(reuse[s.seq_id] for s in tier) < self.min_scattered_reuse:
                return tier
        return idle

    def _busy_neighbours(self, slot: Slot) -> int:
        if not self.keep_busy_together:
            return 0
        return sum(s.busy for s in self.slots[max(slot.seq_id - 1, 0) : slot.seq_id + 2])

    def reusable(self, num_matched: int, num_prompt: int) -> bool:
        """Whether a cached prefix of `num_matched` tokens is worth reusing."""
        return num_matched >= self.min_prefix_reuse or (num_matched > 0 and num_matched == num_prompt)

    def free(self, slot: Slot) -> None:
        """The session ended: the slot goes idle and keeps its KV as a prefix cache."""
        slot.busy = False
        slot.num_confirmed = 0
        self._touch(slot)

    def _touch(self, slot: Slot) -> None:
        self._clock += 1
        slot.last_used = self._clock

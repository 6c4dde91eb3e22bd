"""KV operations on slots that need both the allocator's view and the runner.

The allocator only mirrors what the KV holds; these keep the two in step when a
new session takes a slot (and a far slot's cached prefix is copied into it), when a
turn forks into n samples, when a named session is restored or saved, when a
stale cached tail is cut, on a context shift, when a slot's KV must be dropped,
and when a sample leaves its slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from ...domain.requests import AdapterSet
from ...domain.snapshots import SavedSession
from ..runner_api import Runner
from .allocator import Slot, SlotAllocator, common_prefix_length

log = structlog.get_logger("llmserve.slot_kv")


class SlotKV:
    def __init__(self, runner: Runner, allocator: SlotAllocator) -> None:
        self.runner = runner
        self.allocator = allocator

    def copy(self, src: Slot, dst: Slot) -> None:
        """dst's sequence becomes a copy of src's (cells are shared, not duplicated)."""
        self.runner.seq_rm(dst.seq_id, -1, -1)
        self.runner.seq_cp(src.seq_id, dst.seq_id)
        dst.tokens[:] = src.tokens
        dst.num_confirmed = len(dst.tokens)
        dst.adapters, dst.foreign, dst.num_canonical, dst.base_until = src.adapters, False, src.num_canonical, src.base_until
        dst.save_logits(-1, None)

    def take(self, prompt: Sequence[int], reuse: bool = True, adapters: AdapterSet = ()) -> Slot:
        """The allocator's slot for a session whose input starts with `prompt`, holding the
        longest cached prefix of it: when the slot was chosen next to busy ones (one KV
        stream per slot) and an idle slot elsewhere holds `min_prefix_reuse` or more tokens
        more, that KV is copied in (a copy of the whole stream at the next decode, instead
        of prefilling those tokens again in a ubatch of their own beside decoding streams).
        `reuse` False: the session reuses no prefix (prompt logprobs), so nothing is copied.
        `adapters`: what the session decodes under (a prefix cached under others is not reused)."""
        slot = self.allocator.allocate(prompt, adapters)
        donor = self.allocator.donor_for(slot, prompt) if reuse else None
        if donor is not None:
            self.copy(donor, slot)
            slot.num_confirmed = 0  # nothing is the new session's until it matches
        return slot

    def forget_adapter(self, name: str) -> None:
        """Idle slots cached under adapter `name` drop their KV (a new file may bear the name)."""
        for slot in self.allocator.slots:
            if not slot.busy and any(n == name for n, _ in slot.adapters):
                self.clear(slot)

    def clear(self, slot: Slot) -> None:
        self.runner.seq_rm(slot.seq_id, -1, -1)
        slot.reset()

    def forget_shifted(self, slot: Slot) -> None:
        """A slot its sample leaves: after a context shift its positions moved, so its cells
        are no prefix of anything and are dropped."""
        if slot.shifted:
            self.clear(slot)
            slot.shifted = False

    def free(self, slot: Slot) -> None:
        """Its session is done with `slot`: it goes idle, its KV a prefix cache (unless shifted)."""
        self.forget_shifted(slot)
        self.allocator.free(slot)

    def holds_window(self, slot: Slot) -> bool:
        """Whether the KV holds every cell the slot's next token attends to.

        With sliding-window attention llama.cpp reuses cells that have left the window
        of their sequence's newest token (and purges every older position with them), even
        with a full-size SWA cache. A sequence that grew long and is then cut back to a
        prefix may so have lost positions the prefix's next token needs (the token at
        position n reads n - n_swa + 1 .. n - 1). llama.cpp keeps [pos_min, pos_max]
        contiguous, so pos_min tells.
        """
        num_tokens = len(slot.tokens)
        if num_tokens == 0:
            return True
        n_swa = self.runner.meta.n_swa
        first_needed = max(0, num_tokens - n_swa + 1) if n_swa > 0 else 0
        return 0 <= self.runner.seq_pos_min(slot.seq_id) <= first_needed

    def trim_stale_tail(self, slot: Slot) -> list[int]:
        """Cut what the slot caches past its confirmed history. Returns the history to
        prefill again when the KV cannot serve it after the cut (the sequence is
        dropped), else []."""
        history = slot.tokens[: slot.num_confirmed]
        start = slot.take_stale_tail()
        if start is not None and not self._cut(slot, start):
            return history
        return []

    def _cut(self, slot: Slot, start: int) -> bool:
        """Remove positions from `start` on (the mirror is already cut). False when the
        sequence had to be dropped: llama.cpp could not cut there, or what is left
        lacks cells of the sliding window (see `holds_window`)."""
        if not self.runner.seq_rm(slot.seq_id, start, -1):
            log.warning("seq_rm_partial_failed", seq_id=slot.seq_id, position=start)
        elif not self.holds_window(slot):
            log.info("kv_prefix_dropped", seq_id=slot.seq_id, num_tokens=start,
                     kv_pos_min=self.runner.seq_pos_min(slot.seq_id), reason="sliding window cells reused")
        else:
            return True
        self.clear(slot)
        return False

    def shift(self, slot: Slot, keep: int) -> int:
        """Context shift: drop half of what follows the first `keep` tokens, as llama-server
        does (n_discard = n_left / 2). Returns how many tokens were dropped."""
        discard = (len(slot.tokens) - keep) // 2
        self.runner.seq_shift(slot.seq_id, keep, discard)
        slot.shift(keep, discard)
        return discard

    def restore(self, saved: SavedSession, adapters: AdapterSet = ()) -> tuple[Slot, bool]:
        """A slot holding the saved session's KV: one that still has it in memory, else
        one loaded from the saved state. False (and an empty slot) when neither serves, or
        when the state was computed under other adapters than `adapters` (the resuming call's)."""
        slot = self.allocator.allocate(saved.tokens, adapters)
        if saved.tokens and not slot.foreign and slot.cap(common_prefix_length(slot.tokens, saved.tokens)) == len(saved.tokens):
            slot.num_confirmed = len(saved.tokens)
            slot.save_logits(-1, None)
            if slot.take_stale_tail() is None or self._cut(slot, len(saved.tokens)):  # the rest is another continuation
                return slot, True
        self.clear(slot)
        if not saved.tokens:
            return slot, True
        if not saved.state or saved.adapters != adapters:  # saved without its KV, or another adapter's
            return slot, False
        if self.runner.set_seq_state(slot.seq_id, saved.state):
            slot.tokens[:] = saved.tokens
            slot.adapters = adapters
            if self.holds_window(slot):
                return slot, True
            log.warning("session_state_rejected", session_id=saved.session_id, detail="the state lacks window cells")
        else:
            log.warning("session_state_rejected", session_id=saved.session_id, detail="llama.cpp refused the state")
        self.clear(slot)
        return slot, False

    def export(self, slot: Slot) -> tuple[tuple[int, ...], bytes]:
        """The slot's history and its KV state (a stale cached tail is trimmed first; if
        that drops the sequence, the state is empty and a restore prefills again)."""
        history = tuple(slot.tokens[: slot.num_confirmed])
        if slot.take_stale_tail() is not None:
            self._cut(slot, len(history))
        return history, self.runner.seq_state(slot.seq_id)

"""KV operations on slots that need both the allocator's view and the runner.

The allocator only mirrors what the KV holds; these keep the two in step when a
turn forks into n samples, when a named session is restored or saved, when a
stale cached tail is cut, on a context shift, and when a slot's KV must be
dropped. Executor thread only.
"""

from __future__ import annotations

import structlog

from ..domain import SavedSession
from .allocator import Slot, SlotAllocator, common_prefix_length
from .runner_api import Runner

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
        dst.save_logits(-1, None)

    def clear(self, slot: Slot) -> None:
        self.runner.seq_rm(slot.seq_id, -1, -1)
        slot.reset()

    def trim_stale_tail(self, slot: Slot) -> list[int]:
        """Cut what the slot caches past its confirmed history. Returns the history to
        prefill again when the cache cannot cut there (the sequence is dropped), else []."""
        history = slot.tokens[: slot.num_confirmed]
        start = slot.take_stale_tail()
        if start is not None and not self.runner.seq_rm(slot.seq_id, start, -1):
            log.warning("seq_rm_partial_failed", seq_id=slot.seq_id, position=start)
            self.clear(slot)
            return history
        return []

    def shift(self, slot: Slot, keep: int) -> int:
        """Context shift: drop half of what follows the first `keep` tokens, as llama-server
        does (n_discard = n_left / 2). Returns how many tokens were dropped."""
        discard = (len(slot.tokens) - keep) // 2
        self.runner.seq_shift(slot.seq_id, keep, discard)
        slot.shift(keep, discard)
        return discard

    def restore(self, saved: SavedSession) -> tuple[Slot, SavedSession | None]:
        """A slot holding the saved session's KV: one that still has it in memory, else
        one loaded from the saved state. The second value is None if llama.cpp refused it."""
        slot = self.allocator.allocate(saved.tokens)
        if saved.tokens and common_prefix_length(slot.tokens, saved.tokens) == len(saved.tokens):
            del slot.tokens[len(saved.tokens) :]  # the rest is another continuation
            slot.save_logits(-1, None)
            self.runner.seq_rm(slot.seq_id, len(saved.tokens), -1)
            return slot, saved
        self.clear(slot)
        if not saved.tokens:
            return slot, saved
        if self.runner.set_seq_state(slot.seq_id, saved.state):
            slot.tokens[:] = saved.tokens
            return slot, saved
        log.warning("session_state_rejected", session_id=saved.session_id, detail="llama.cpp refused the state")
        self.clear(slot)
        return slot, None

    def export(self, slot: Slot) -> tuple[tuple[int, ...], bytes]:
        """The slot's history and its KV state (a stale cached tail is trimmed first)."""
        history = tuple(slot.tokens[: slot.num_confirmed])
        if slot.take_stale_tail() is not None:
            self.runner.seq_rm(slot.seq_id, len(history), -1)
        return history, self.runner.seq_state(slot.seq_id)

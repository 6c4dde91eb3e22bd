"""Executor-side state of one Generate stream, from open to close, and its samples.

A session holds what belongs to the stream: its parameters, sink and deadline, a saved
session waiting for a slot, the conversation a named session saves, input sent during a
turn, and its samples (`sample.py`). `samples[0]`, the main sample, decodes the stream's
history across turns and is addressed by the session's own key. A turn with n > 1 forks
n - 1 more samples when its prompt has been evaluated: each on a slot reserved when the
session was admitted, holding a copy of the main sample's KV; a forked sample lives for
that turn, and its slot goes back to `reserved` for the next turn's fork. Preempted
(`admission.py`), every sample and reserved slot gives its slot up at once, and gets one
back at once. Its samples share its sink: they pause together (`paused`). Only the executor
thread touches these objects.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace

from ...domain.events import EventSink
from ...domain.requests import SamplingParams, SessionParams
from ...domain.snapshots import SavedSession
from ..chat.chat import Conversation, SavedChat
from ..runner_api import TokenSampler
from .allocator import Slot, SlotAllocator
from .sample import Sample
from .slot_kv import SlotKV
from .speculation import SeqSpeculation
from .turn import TurnFinish

# Events a session may have waiting in its sink before the executor pauses it:
# a client that stops reading holds up only its own samples.
MAX_BACKLOG = 64


class Session:
    def __init__(self, key: int, params: SessionParams, sink: EventSink, n_ctx_per_slot: int,
                 deadline: float | None = None, sampler: TokenSampler | None = None,
                 speculation: SeqSpeculation | None = None, t_open: float | None = None,
                 canonical_chunk: int | None = None) -> None:
        """`sampler`, `speculation`, `canonical_chunk`: the main sample's (see `Sample`);
        `t_open`: when the stream opened (None: now)."""
        self.key = key
        self.params = params
        self.sink = sink
        self.deadline = deadline
        self.t_open = time.monotonic() if t_open is None else t_open
        self.restore: SavedSession | None = None  # a saved session waiting for a slot
        self.conversation: Conversation | None = None  # read when a named session is saved
        self.grammar: object | None = None  # the compiled constraint its samplers clone
        self.later: deque[tuple[tuple[int, ...], bool, bool]] = deque()  # input sent during a turn
        self.samples: list[Sample[Session]] = [
            Sample(key, self, 0, params, sink, n_ctx_per_slot, self.t_open, sampler, speculation, canonical_chunk)]
        self.reserved: list[Slot] = []  # slots held for the other samples until they fork
        self.samples_open = 0  # samples of the current turn still generating
        self.forked = False  # the current turn's other samples forked (or there are none)
        self.preempted_history: int | None = None  # gave its slot up: its first pending tokens are this much history
        self.t_paused: float | None = None  # since when its client has read nothing (paused)

    @property
    def main(self) -> Sample[Session]:
        """The sample that holds the stream's history (index 0)."""
        return self.samples[0]

    @property
    def paused(self) -> bool:
        """Its client stopped reading: its events pile up unread."""
        return self.sink.backlog >= MAX_BACKLOG

    @property
    def num_slots_held(self) -> int:
        """Slots the session would give up if preempted: its samples' and its reserved ones."""
        return sum(x.slot is not None for x in self.samples) + len(self.reserved)

    def saved_chat(self) -> SavedChat | None:
        """The conversation a named session is saved with (None: not a chat session)."""
        return self.conversation.saved() if self.conversation is not None else None

    # ------------------------------------------------------------- n samples

    def begin_turn(self) -> None:
        self.samples_open = 1
        self.forked = self.params.num_samples <= 1
        self.main.begin_turn()

    def fork_samples(self, keys: Iterator[int], kv: SlotKV,
                     make_sampler: Callable[[SamplingParams, bool], TokenSampler]) -> list[Sample[Session]]:
        """First logits of a turn with n > 1: copy the main sample's KV into the reserved
        slots, one more sample on each (seed + its index). [] unless the turn forks now."""
        main = self.main
        if not self.reserved or main.turn is None or main.turn.t_first_token is not None:
            return []
        assert main.slot is not None
        forked = []
        for slot in self.reserved:
            kv.copy(main.slot, slot)
            index = len(self.samples)
            sampling = replace(self.params.sampling, seed=(self.params.sampling.seed + index) % 0xFFFFFFFF)
            params = replace(self.params, sampling=sampling, num_samples=1)
            sample = main.fork(next(keys), index, params, slot, make_sampler(sampling, params.stopping.ignore_eos))
            self.samples.append(sample)
            self.samples_open += 1
            forked.append(sample)
        self.reserved.clear()
        self.forked = True
        return forked

    def end_turn(self, sample: Sample[Session], finish: TurnFinish, kv: SlotKV) -> bool:
        """`sample`'s turn ended. A forked sample leaves: its slot goes back to `reserved`,
        where the next turn's sample forks again. True if it left."""
        if sample is self.main and not self.forked:  # ended before the others forked: they end too
            self._end_unforked(finish)
        sample.finish_turn(finish, final=self.samples_open == 1)
        self.samples_open -= 1
        if sample is self.main:
            return False
        self.samples.remove(sample)
        slot = sample.leave()
        if slot is not None:
            kv.forget_shifted(slot)
            self.reserved.append(slot)
        return True

    def _end_unforked(self, finish: TurnFinish) -> None:
        """The main sample's turn ends before the turn's other samples forked from it (a
        deadline or a cancel during the prompt): each of them ends with it, having generated
        nothing, so every sample of the turn has its turn end."""
        main = self.main
        assert main.turn is not None
        for index in range(1, self.params.num_samples):
            seed = (main.params.sampling.seed + index) % 0xFFFFFFFF
            self.sink.put(main.turn.unforked_end(finish, index, seed, main.queue_ms))
        self.forked = True

    def release(self, kv: SlotKV, allocator: SlotAllocator) -> None:
        """The stream is gone: free every slot now (forked samples', reserved, the main
        one); their KV stays as a prefix cache."""
        for sample in self.samples[1:]:
            if (slot := sample.leave()) is not None:
                kv.free(slot)
        del self.samples[1:]
        for slot in self.reserved:
            allocator.free(slot)
        self.reserved.clear()
        if (slot := self.main.leave()) is not None:
            kv.free(slot)
        self.grammar = None


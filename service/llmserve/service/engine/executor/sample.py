"""One KV sequence's decoding state: a sample of a Generate session's turns.

Its slot, the input not yet in the KV (the last token kept back until the turn's end, for its logits), sampler,
speculation state and draft, next token, the turn under way, saved logits, timings. A session has one, `main`,
holding its history across turns; a turn with n > 1 forks more on reserved slots. A turn's last sampled token, which
never entered the KV, is the next turn's first pending one: the KV mirrors the transcript. A sample owns its writes:
other modules call its methods, named for what they record (tests/unit/codebase/test_sample_writes.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from ...domain.events import EventSink, FinishReason, TokenLogprob
from ...domain.requests import SessionParams
from ...domain.snapshots import SavedSession
from ..runner_api import TokenSampler
from . import alora
from . import canonical_chunks as chunks
from .allocator import Slot, common_prefix_length
from .speculation import SeqSpeculation
from .turn import Turn, TurnFinish

PROMPT_LOGPROBS_CHUNK = 32
SessionT = TypeVar("SessionT")  # the session a sample belongs to (session.py, which imports this module)


class Sample(Generic[SessionT]):
    def __init__(self, key: int, session: SessionT, index: int, params: SessionParams, sink: EventSink,
                 n_ctx_per_slot: int, t_open: float, sampler: TokenSampler | None = None,
                 speculation: SeqSpeculation | None = None, canonical_chunk: int | None = None) -> None:
        """`key`: what plans and steps address it by (the main sample's: its session's); `index`: in the turn's n
        outputs; `params`: a forked sample's have its own seed, and `sampler` is made from them; `speculation`:
        drafting state (None: none); `canonical_chunk`: deterministic, its KV computed in these chunks
        (canonical_chunks.py)."""
        self.key, self.session, self.index, self.params, self.sink = key, session, index, params, sink
        self.n_ctx_per_slot, self.canonical_chunk = n_ctx_per_slot, canonical_chunk  # n_ctx: KV cells it may hold
        self.t_open = t_open  # when its session opened
        self.prompt_logits: np.ndarray | None = None  # last evaluated row, for prompt logprobs
        self.ready_logits: np.ndarray | None = None  # saved logits to sample the turn's first token from
        self.t_last_token, self.queue_ms, self.t_slot = 0.0, 0.0, 0.0  # t_slot: when the slot was attached
        self.slot: Slot | None = None
        self.sampler, self.speculation = sampler, speculation
        self.draft: list[int] = []  # proposed for the coming step
        self.pending: list[int] = []  # input not yet in the KV
        self.next_token: int | None = None  # sampled, waits to be decoded
        self.turn: Turn | None = None
        self.turn_input, self.turn_cached = 0, 0  # the upcoming turn's input tokens; of its history, those in the KV
        self.num_accepted_ahead = 0  # leading pending tokens the sampler already accepted
        self.overflowed = False  # the upcoming turn's input does not fit the context
        self.alora_from: int | None = None  # an aLoRA's: where its adapter applies from (alora.py)

    def fork(self, key: int, index: int, params: SessionParams, slot: Slot, sampler: TokenSampler) -> Sample[SessionT]:
        """Another sample of this turn (n > 1) on `slot`, which holds a copy of the KV already."""
        assert self.turn is not None
        speculation = SeqSpeculation(self.speculation.settings) if self.speculation is not None else None
        forked = Sample(key, self.session, index, params, self.sink, self.n_ctx_per_slot, self.t_open, sampler,
                        speculation, self.canonical_chunk)
        forked.slot, forked.alora_from = slot, self.alora_from
        forked.queue_ms, forked.t_slot = self.queue_ms, self.t_slot
        sampler.accept(slot.tokens)
        forked.turn = self.turn.fork()
        return forked

    @property
    def num_context_tokens(self) -> int:
        """Tokens the next decode would have in context (history + pending input)."""
        confirmed = self.slot.num_confirmed if self.slot else 0
        return confirmed + len(self.pending)

    def replace_history(self, tokens: tuple[int, ...]) -> None:
        """Chat: `tokens` are the whole rendered conversation. What the KV already
        holds of it is reused; the rest of the old history becomes a stale tail."""
        self.pending.clear()
        self.turn_input = self.turn_cached = 0
        if self.slot is not None:
            self.slot.num_confirmed = 0
        self.add_input(tokens)

    def add_input(self, tokens: tuple[int, ...]) -> None:
        self.turn_input += len(tokens)
        if self.slot is not None and not self.pending and not self.params.alora_invocation:
            # The input continues the confirmed history: reuse what the slot caches.
            matched = self.slot.match(tokens, self.canonical_chunk)
            self.turn_cached += matched
            tokens = tokens[matched:]
        self.pending.extend(tokens)
        self.overflowed = self.overflowed or self.num_context_tokens > self.n_ctx_per_slot

    def attach(self, slot: Slot, reusable: Callable[[int, int], bool]) -> None:
        """Got a slot: confirm the cached prefix of the pending input if it is worth it."""
        self._took(slot)
        head = alora.reusable_head(self)  # the pending input, or an aLoRA's part before its invocation
        shared = slot.cap(common_prefix_length(slot.tokens, head))
        if not self.params.output.reuses_prefix or not reusable(shared, len(self.pending)):
            matched = 0
        else:
            matched = slot.match(head, self.canonical_chunk)
        self.turn_cached += matched
        del self.pending[:matched]
        self._keep_a_token_for_logits()
        self._accept_history()

    def resume(self, slot: Slot, saved: SavedSession, loaded: bool) -> None:
        """Got a slot for a saved session: holding its KV if `loaded`, else empty, and the
        saved history is prefilled again."""
        self._took(slot)
        if loaded:
            slot.num_confirmed = len(slot.tokens)
            self.pending[:0] = saved.pending
            self.turn_cached = slot.num_confirmed
        else:
            self.pending[:0] = (*saved.tokens, *saved.pending)
        self._keep_a_token_for_logits()
        self._accept_history()

    def _took(self, slot: Slot) -> None:
        self.slot, self.t_slot = slot, time.monotonic()
        self.queue_ms = (self.t_slot - self.t_open) * 1000.0

    def prefill_again(self, history: list[int]) -> bool:
        """The slot's KV was dropped (`SlotKV.trim_stale_tail`): `history` prefills again; False if empty."""
        if not history:
            return False
        self.pending[:0] = history
        self.num_accepted_ahead += len(history)  # the sampler has seen them as history
        self.turn_cached = max(0, self.turn_cached - len(history))
        if self.turn is not None:
            self.turn.cached_tokens = max(0, self.turn.cached_tokens - len(history))
        return True

    def _accept_history(self) -> None:
        # Penalties and DRY see a cached prefix as if prefilled: a cache hit samples as a miss would.
        if self.sampler is not None and self.slot is not None:
            self.sampler.accept(self.slot.tokens[: self.slot.num_confirmed])

    def begin_turn(self) -> None:
        if self.sampler is not None:
            self.sampler.begin_turn()
        self.turn = Turn.begin(self.params.stopping.stop, self.turn_input, self.turn_cached)
        self.alora_from = alora.invocation_start(self.slot, self.pending, self.params.alora_invocation)
        self._keep_a_token_for_logits()

    def _keep_a_token_for_logits(self) -> None:
        # All cached: sample from the logits saved when a prompt last ended here, else decode the last token again.
        if self.turn is not None and self.slot is not None and not self.pending:
            if self.next_token is None and self.slot.num_confirmed > 0:
                saved = self.slot.logits_at(self.slot.num_confirmed - 1)
                if saved is not None:
                    self.ready_logits = saved
                else:
                    self.pending.append(self.slot.unconfirm_last())
                    self.turn_cached -= 1
        if self.turn is not None and self.slot is not None:
            self.turn.cached_tokens = self.turn_cached
            self.turn.t_ready = max(self.turn.t_end_of_input, time.monotonic())

    @property
    def generating(self) -> bool:
        return self.next_token is not None

    @property
    def num_prefill_ready(self) -> int:
        """Pending tokens that may be prefilled now (the last one waits for end of turn).
        0 while history + pending exceed the slot: input sent during a reply fitted when
        it came, but the reply has grown the history since; its turn ends CONTEXT_FULL."""
        if self.slot is None or self.generating or self.overflowed or self.num_context_tokens > self.n_ctx_per_slot:
            return 0
        ready = len(self.pending) if self.turn is not None else max(len(self.pending) - 1, 0)
        if self.canonical_chunk is not None:
            ready = chunks.num_ready(self.slot.num_confirmed, ready, self.canonical_chunk, self.turn is not None)
        ready = alora.prefill_ready(self, ready)
        # Prompt logprobs need logits for every row: llama.cpp's output buffer holds
        # rows x vocabulary floats (1 MiB a row for 262k), so those prompts go in chunks.
        return min(ready, PROMPT_LOGPROBS_CHUNK) if self.params.output.prompt_logprobs else ready

    def drop_input(self) -> None:
        """The turn's input does not fit the context: it never enters the KV."""
        self.pending.clear()

    def set_draft(self, draft: list[int]) -> None:
        """Speculation: the tokens proposed for the coming step ([]: none)."""
        self.draft = draft

    def take_ready_logits(self) -> np.ndarray | None:
        """The saved logits the turn's first token is sampled from, once."""
        logits, self.ready_logits = self.ready_logits, None
        return logits

    def give_up_slot(self) -> Slot:
        """Preemption by recompute: its slot's history and a token sampled but not yet decoded
        go back in front of its pending input, seen by the sampler. Returns the slot, to free."""
        slot = self.slot
        assert slot is not None
        history = slot.tokens[: slot.num_confirmed]
        sampled = [self.next_token] if self.next_token is not None else []
        # Everything before the old pending input has been through the sampler already.
        self.num_accepted_ahead += len(history) + len(sampled)
        self.pending[:0] = [*history, *sampled]
        self.next_token, self.draft = None, []
        if self.turn is None or self.turn.t_first_token is None:
            self.turn_cached = 0  # the coming turn's cached tokens: what the slot still holds at reattach
        self.slot = None
        return slot

    def move_to(self, slot: Slot) -> None:
        """Its prompt starts in another empty slot than the one it took (`GenerationStep.seat_by_length`)."""
        self.slot = slot

    def reattach(self, slot: Slot) -> int:
        """After preemption, `slot`: confirm what it caches of the history but a token to decode
        for the logits the turn samples from next. Returns how many tokens it caches."""
        self.slot = slot
        matched = 0 if self.params.alora_invocation else slot.match(self.pending[:-1], self.canonical_chunk)
        del self.pending[:matched]
        self.num_accepted_ahead = max(0, self.num_accepted_ahead - matched)
        if self.turn is None or self.turn.t_first_token is None:
            self.turn_cached += matched
            if self.turn is not None:
                self.turn.cached_tokens = self.turn_cached
        return matched

    def leave(self) -> Slot | None:
        """Done (a forked sample's turn, or the session, ended): the sampler is freed; returns
        the slot it held, if any."""
        if self.sampler is not None:
            self.sampler.free()
            self.sampler = None
        slot, self.slot = self.slot, None
        return slot

    def record_decode(self, token: int) -> None:
        """The sampled token entered the KV."""
        assert self.slot is not None
        self.slot.append([token], adapter_cells=alora.adapter_cells(self))
        self.next_token = None

    def record_prefill(self, tokens: list[int], logits: np.ndarray | None) -> int:
        """A prompt chunk entered the KV: it leaves `pending`, the sampler sees it but the leading
        tokens it saw (returns how many); `logits` (its last row's) wait for a prompt ending here."""
        assert self.slot is not None and self.sampler is not None
        self.slot.append(tokens, self.canonical_chunk, alora.adapter_cells(self))
        if logits is not None:
            self.slot.save_logits(len(self.slot.tokens) - 1, logits.copy())
        del self.pending[: len(tokens)]
        num_seen = min(len(tokens), self.num_accepted_ahead)
        self.num_accepted_ahead -= num_seen
        self.sampler.accept(tokens[num_seen:])
        return num_seen

    def keep_prompt_logits(self, row: np.ndarray | None) -> None:
        """Prompt logprobs: the last evaluated row, which scores the next chunk's first token."""
        self.prompt_logits = row

    def record_picked(self, token: int, logprob: TokenLogprob | None) -> float | None:
        """A token picked for the turn, held for output. Returns the seconds since the turn's last (None: first)."""
        assert self.turn is not None
        now = time.monotonic()
        gap, self.t_last_token = (None if self.turn.t_first_token is None else now - self.t_last_token), now
        self.turn.record_token(token, logprob, now)
        return gap

    def continue_with(self, token: int) -> None:
        """The turn goes on: the picked `token` waits to be decoded."""
        self.next_token = token

    def emit_tokens(self, text: str) -> None:
        assert self.turn is not None
        if (event := self.turn.take_held(text, self.index)) is not None:
            self.sink.put(event)

    def finish_turn(self, finish: TurnFinish, final: bool) -> None:
        """Send the rest of the text and the turn end (`final`: the last of the turn's
        samples to end); get ready for the next turn."""
        turn = self.turn
        assert turn is not None  # a stop sequence's held text is cut below; its held ids still go out
        self.emit_tokens("" if finish.reason == FinishReason.STOP_SEQUENCE else turn.text.flush())
        t_slot = None if self.slot is None else self.t_slot  # None: ended waiting for a slot
        self.sink.put(turn.end_event(finish, self.index, self.params.sampling.seed, final, self.t_open, t_slot,
                                     self.queue_ms))
        self.turn, self.next_token, self.prompt_logits = None, None, None
        self.queue_ms, self.overflowed, self.turn_input = 0.0, False, 0
        self._rewind_to_canonical()
        self.turn_cached = self.slot.num_confirmed if self.slot else 0
        if finish.last_token is not None:
            # The transcript goes on from it: it enters the KV with the next turn's input.
            self.pending.append(finish.last_token)

    def _rewind_to_canonical(self) -> None:
        """Deterministic: the history past the last whole canonical chunk (the prompt's last
        chunk, the reply) is computed again, in chunks, with the next turn's input."""
        slot = self.slot
        if self.canonical_chunk is not None and slot is not None:
            start = chunks.rewind_point(min(slot.num_canonical, slot.num_confirmed), self.canonical_chunk)
            history, slot.num_confirmed = slot.tokens[start : slot.num_confirmed], start
            self.prefill_again(history)

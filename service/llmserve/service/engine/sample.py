"""One sequence's decoding state: a sample of a Generate session's turns.

A `Sample` holds what one KV sequence needs to generate: its slot, the input not yet in
the KV (prefilled incrementally, always keeping the last token back until the end of the
turn so that its logits can be requested), the sampler, the speculation state and
draft, the next token, the turn under way, the saved logits and the timings. A session
(`session.py`) has one sample, `Session.main`, that holds its history across turns; a
turn with n > 1 adds forked samples on reserved slots that live for that turn only.
When a turn ends the last sampled token, which never entered the KV, becomes the first
pending token of the next turn so that the KV always mirrors the transcript. Only the
executor thread touches these objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..domain.events import EventSink, FinishReason, TokenEvent, TurnEndEvent
from ..domain.requests import SessionParams
from ..domain.snapshots import SavedSession
from .allocator import Slot, common_prefix_length
from .runner_api import TokenSampler
from .speculation import SeqSpeculation
from .textstream import TextStream
from .turn import Turn, TurnFinish

# Events a session may have waiting in its sink before the executor pauses it:
# a client that stops reading holds up only its own sequence.
MAX_BACKLOG = 64
PROMPT_LOGPROBS_CHUNK = 32


class Sample:
    def __init__(self, key: int, session_key: int, index: int, params: SessionParams, sink: EventSink,
                 n_ctx_per_slot: int, t_open: float) -> None:
        """`key`: what plans and steps address it by (the main sample's is its session's);
        `session_key`: the session it belongs to (no reference: session.py imports this
        module); `index`: the sample's index in the turn's n outputs; `params`: a forked
        sample's have its own seed."""
        self.key = key
        self.session_key = session_key
        self.index = index
        self.params = params
        self.sink = sink
        self.n_ctx_per_slot = n_ctx_per_slot  # KV cells this sample may hold
        self.t_open = t_open  # when its session opened
        self.prompt_logits: np.ndarray | None = None  # last evaluated row, for prompt logprobs
        self.ready_logits: np.ndarray | None = None  # saved logits to sample the turn's first token from
        self.t_last_token = 0.0
        self.t_slot = 0.0  # when the slot was attached
        self.queue_ms = 0.0
        self.slot: Slot | None = None
        self.sampler: TokenSampler | None = None
        self.speculation: SeqSpeculation | None = None  # drafting state (None: no speculation)
        self.draft: list[int] = []  # proposed for the coming step
        self.pending: list[int] = []  # input not yet in the KV
        self.next_token: int | None = None  # sampled, waits to be decoded
        self.turn: Turn | None = None
        self.turn_input = 0  # tokens the client sent for the upcoming turn
        self.turn_cached = 0  # of the upcoming turn's history, tokens already in the KV
        self.num_accepted_ahead = 0  # leading pending tokens the sampler already accepted
        self.overflowed = False  # the upcoming turn's input does not fit the context

    def fork(self, key: int, index: int, params: SessionParams, slot: Slot, sampler: TokenSampler) -> Sample:
        """Another sample of this turn (n > 1) on `slot`, which already holds a copy of the KV;
        `sampler` was made from `params`."""
        assert self.turn is not None
        forked = Sample(key, self.session_key, index, params, self.sink, self.n_ctx_per_slot, self.t_open)
        forked.slot = slot
        forked.sampler = sampler
        sampler.accept(slot.tokens)
        forked.turn = self.turn.fork()
        forked.queue_ms, forked.t_slot = self.queue_ms, self.t_slot
        if self.speculation is not None:
            forked.speculation = SeqSpeculation(self.speculation.settings)
        return forked

    # ---------------------------------------------------------------- input

    @property
    def num_context_tokens(self) -> int:
        """Tokens the next decode would have in context (history + pending input)."""
        confirmed = self.slot.num_confirmed if self.slot else 0
        return confirmed + len(self.pending)

    def replace_history(self, tokens: tuple[int, ...]) -> None:
        """Chat: `tokens` are the whole rendered conversation. What the KV already
        holds of it is reused; the rest of the old history becomes a stale tail."""
        self.pending.clear()
        self.turn_input = 0
        self.turn_cached = 0
        if self.slot is not None:
            self.slot.num_confirmed = 0
        self.add_input(tokens)

    def add_input(self, tokens: tuple[int, ...]) -> None:
        self.turn_input += len(tokens)
        if self.slot is not None and not self.pending:
            # The input continues the confirmed history: reuse what the slot caches.
            matched = self.slot.match(tokens)
            self.turn_cached += matched
            tokens = tokens[matched:]
        self.pending.extend(tokens)
        if self.num_context_tokens > self.n_ctx_per_slot:
            self.overflowed = True

    def attach(self, slot: Slot, reusable: Callable[[int, int], bool]) -> None:
        """Got a slot: confirm the cached prefix of the pending input if it is worth it."""
        self.slot = slot
        self.t_slot = time.monotonic()
        self.queue_ms = (self.t_slot - self.t_open) * 1000.0
        shared = common_prefix_length(slot.tokens, self.pending)
        # Prompt logprobs need every prompt token evaluated: no prefix reuse then.
        if self.params.output.prompt_logprobs or not reusable(shared, len(self.pending)):
            matched = 0
        else:
            matched = slot.match(self.pending)
        self.turn_cached += matched
        del self.pending[:matched]
        self._keep_a_token_for_logits()
        self._accept_history()

    def resume(self, slot: Slot, saved: SavedSession, loaded: bool) -> None:
        """Got a slot for a saved session: holding its KV if `loaded`, else empty, and the
        saved history is prefilled again."""
        self.slot = slot
        self.t_slot = time.monotonic()
        self.queue_ms = (self.t_slot - self.t_open) * 1000.0
        if loaded:
            slot.num_confirmed = len(slot.tokens)
            self.pending[:0] = saved.pending
            self.turn_cached = slot.num_confirmed
        else:
            self.pending[:0] = (*saved.tokens, *saved.pending)
        self._keep_a_token_for_logits()
        self._accept_history()

    def prefill_again(self, history: list[int]) -> bool:
        """The slot's KV was dropped (see `SlotKV.trim_stale_tail`): `history` is
        prefilled again and no longer counts as cached. False if `history` is empty."""
        if not history:
            return False
        self.pending[:0] = history
        self.num_accepted_ahead += len(history)  # the sampler has seen them as history
        self.turn_cached = max(0, self.turn_cached - len(history))
        if self.turn is not None:
            self.turn.cached_tokens = max(0, self.turn.cached_tokens - len(history))
        return True

    def _accept_history(self) -> None:
        # Penalties and DRY see the cached prefix as if it had been prefilled, so a cache
        # hit samples as a miss would.
        if self.sampler is not None and self.slot is not None:
            self.sampler.accept(self.slot.tokens[: self.slot.num_confirmed])

    def begin_turn(self) -> None:
        if self.sampler is not None:
            self.sampler.begin_turn()
        now = time.monotonic()
        self.turn = Turn(
            text=TextStream(self.params.stopping.stop),
            prompt_tokens=self.turn_input,
            cached_tokens=self.turn_cached,
            t_end_of_input=now,
            t_ready=now,
        )
        self._keep_a_token_for_logits()

    def _keep_a_token_for_logits(self) -> None:
        # Everything is cached: sample from the logits saved when this prompt last
        # ended here, else decode the last token again to get its logits.
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

    # ------------------------------------------------------------- scheduling

    @property
    def generating(self) -> bool:
        return self.next_token is not None

    @property
    def paused(self) -> bool:
        return self.sink.backlog >= MAX_BACKLOG

    @property
    def num_prefill_ready(self) -> int:
        """Pending tokens that may be prefilled now (the last one waits for end of turn).
        0 while history + pending exceed the slot: input sent during a reply fitted when
        it came, but the reply has grown the history since; its turn ends CONTEXT_FULL."""
        if self.slot is None or self.generating or self.overflowed or self.num_context_tokens > self.n_ctx_per_slot:
            return 0
        ready = len(self.pending) if self.turn is not None else max(len(self.pending) - 1, 0)
        # Prompt logprobs need logits for every row: llama.cpp's output buffer holds
        # rows x vocabulary floats (1 MiB a row for 262k), so those prompts go in chunks.
        return min(ready, PROMPT_LOGPROBS_CHUNK) if self.params.output.prompt_logprobs else ready

    # ----------------------------------------------------- after each decode

    def record_decode(self, token: int) -> None:
        """The sampled token entered the KV."""
        assert self.slot is not None
        self.slot.append([token])
        self.next_token = None

    def record_prefill(self, tokens: list[int], logits: np.ndarray | None) -> int:
        """A prompt chunk entered the KV: it leaves `pending` and the sampler sees it (but
        the leading tokens it already saw: returns how many). `logits`: of its last row,
        kept for the next turn that ends its prompt here."""
        assert self.slot is not None and self.sampler is not None
        self.slot.append(tokens)
        if logits is not None:
            self.slot.save_logits(len(self.slot.tokens) - 1, logits.copy())
        del self.pending[: len(tokens)]
        num_seen = min(len(tokens), self.num_accepted_ahead)
        self.num_accepted_ahead -= num_seen
        self.sampler.accept(tokens[num_seen:])
        return num_seen

    # ---------------------------------------------------------------- output

    def emit_tokens(self, text: str) -> None:
        turn = self.turn
        assert turn is not None
        if text or turn.held_ids:
            self.sink.put(TokenEvent(text, tuple(turn.held_ids), tuple(turn.held_logprobs), index=self.index))
            turn.held_ids.clear()
            turn.held_logprobs.clear()

    def end_unforked(self, finish: TurnFinish, index: int) -> None:
        """This (the main) sample's turn ends before the turn's other samples forked from it
        (a deadline or a cancel during the prompt): sample `index` ends with it, having
        generated nothing, so every sample of the turn has its turn end."""
        turn = self.turn
        assert turn is not None
        now = time.monotonic()
        self.sink.put(TurnEndEvent(
            finish_reason=finish.reason, prompt_tokens=turn.prompt_tokens, cached_tokens=turn.cached_tokens,
            completion_tokens=0, queue_ms=self.queue_ms, ttft_ms=0.0, prompt_ms=0.0, decode_ms=0.0,
            seed=(self.params.sampling.seed + index) % 0xFFFFFFFF, message=finish.message, index=index, final=False,
            t_queued=now, t_slot=now, t_ready=now, t_first_token=now, t_end=now,
        ))

    def finish_turn(self, finish: TurnFinish, final: bool) -> None:
        """Send the rest of the text and the turn end (`final`: the last of the turn's
        samples to end); get ready for the next turn."""
        turn = self.turn
        assert turn is not None
        reason = finish.reason
        if reason != FinishReason.STOP_SEQUENCE:
            self.emit_tokens(turn.text.flush())
        elif turn.held_ids:
            self.emit_tokens("")
        now = time.monotonic()
        first = turn.t_first_token if turn.t_first_token is not None else now
        decode_ms = (now - first) * 1000.0
        if self.slot is None:  # ended while waiting for a slot: no prefill, no decode
            t_queued, t_slot, t_ready = self.t_open, now, now
        else:  # the turn that got the slot waited queue_ms; later turns hold it
            t_slot = self.t_slot if self.queue_ms else turn.t_ready
            t_queued, t_ready = t_slot - self.queue_ms / 1000.0, turn.t_ready
        self.sink.put(
            TurnEndEvent(
                finish_reason=reason, prompt_tokens=turn.prompt_tokens, cached_tokens=turn.cached_tokens,
                completion_tokens=turn.completion_tokens, queue_ms=self.queue_ms,
                ttft_ms=(first - turn.t_end_of_input) * 1000.0, prompt_ms=max(first - turn.t_ready, 0.0) * 1000.0,
                decode_ms=decode_ms, seed=self.params.sampling.seed, matched_stop=finish.matched_stop,
                message=finish.message, index=self.index, matched_stop_token_id=finish.matched_stop_token_id,
                draft_tokens=turn.num_drafted, accepted_draft_tokens=turn.num_accepted,
                final=final, t_queued=t_queued, t_slot=t_slot, t_ready=t_ready,
                t_first_token=first, t_end=now,
            )
        )
        self.turn = None
        self.next_token = None
        self.prompt_logits = None
        self.queue_ms = 0.0
        self.overflowed = False
        self.turn_input = 0
        self.turn_cached = self.slot.num_confirmed if self.slot else 0
        if finish.last_token is not None:
            # The transcript goes on from the last sampled token: it enters the KV
            # with the next turn's input.
            self.pending.append(finish.last_token)

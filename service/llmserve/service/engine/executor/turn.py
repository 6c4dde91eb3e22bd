"""A turn's counters and text state, the events that end it, and how a turn ended.

A turn's state is written here and by its sample (sample.py) alone, through these methods
(tests/unit/test_sample_writes.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...domain.events import FinishReason, TokenEvent, TokenLogprob, TurnEndEvent
from .textstream import TextStream


@dataclass(frozen=True)
class TurnFinish:
    """How a turn ended; `last_token` was sampled but never entered the KV."""

    reason: FinishReason
    last_token: int | None
    matched_stop: str = ""
    message: str = ""
    matched_stop_token_id: int | None = None


@dataclass
class Turn:
    """Counters and text state of the turn being generated."""

    text: TextStream
    prompt_tokens: int
    cached_tokens: int
    t_end_of_input: float
    t_ready: float  # when the turn could start computing (input ended and slot held)
    t_first_token: float | None = None
    completion_tokens: int = 0
    held_ids: list[int] = field(default_factory=list)
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    num_drafted: int = 0  # speculative draft tokens verified this turn
    num_accepted: int = 0  # of them, kept

    @classmethod
    def begin(cls, stop: tuple[str, ...], prompt_tokens: int, cached_tokens: int) -> Turn:
        """The input ended now: a turn with the stop strings `stop`."""
        now = time.monotonic()
        return cls(TextStream(stop), prompt_tokens, cached_tokens, t_end_of_input=now, t_ready=now)

    def fork(self) -> Turn:
        """The same turn for another sample (n > 1): same input, its own output."""
        return Turn(
            text=TextStream(self.text.stop),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            t_end_of_input=self.t_end_of_input,
            t_ready=self.t_ready,
        )

    def record_token(self, token: int, logprob: TokenLogprob | None, now: float) -> None:
        """A token was picked at `now`: it counts, and waits for its text to go out."""
        if self.t_first_token is None:
            self.t_first_token = now
        self.completion_tokens += 1
        self.held_ids.append(token)
        if logprob is not None:
            self.held_logprobs.append(logprob)

    def record_drafts(self, num_drafted: int, num_accepted: int) -> None:
        """A draft of `num_drafted` tokens was verified; `num_accepted` of them were kept."""
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted

    def take_held(self, text: str, index: int) -> TokenEvent | None:
        """The event carrying `text` and the tokens held since the last one (None: nothing to send)."""
        if not text and not self.held_ids:
            return None
        event = TokenEvent(text, tuple(self.held_ids), tuple(self.held_logprobs), index=index)
        self.held_ids.clear()
        self.held_logprobs.clear()
        return event

    def end_event(self, finish: TurnFinish, index: int, seed: int, final: bool, t_open: float,
                  t_slot: float | None, queue_ms: float) -> TurnEndEvent:
        """The turn end of sample `index` (`final`: the last of the turn's samples to end).
        `t_slot`: when the sample got its slot (None: it ended waiting for one); `queue_ms`:
        how long this turn waited for it (0: an earlier turn got the slot)."""
        now = time.monotonic()
        first = self.t_first_token if self.t_first_token is not None else now
        if t_slot is None:  # ended while waiting for a slot: no prefill, no decode
            t_queued, t_slot, t_ready = t_open, now, now
        else:  # the turn that got the slot waited queue_ms; later turns hold it
            t_slot = t_slot if queue_ms else self.t_ready
            t_queued, t_ready = t_slot - queue_ms / 1000.0, self.t_ready
        return TurnEndEvent(
            finish_reason=finish.reason, prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            completion_tokens=self.completion_tokens, queue_ms=queue_ms,
            ttft_ms=(first - self.t_end_of_input) * 1000.0, prompt_ms=max(first - self.t_ready, 0.0) * 1000.0,
            decode_ms=(now - first) * 1000.0, seed=seed, matched_stop=finish.matched_stop,
            message=finish.message, index=index, matched_stop_token_id=finish.matched_stop_token_id,
            draft_tokens=self.num_drafted, accepted_draft_tokens=self.num_accepted,
            final=final, t_queued=t_queued, t_slot=t_slot, t_ready=t_ready, t_first_token=first, t_end=now,
        )

    def unforked_end(self, finish: TurnFinish, index: int, seed: int, queue_ms: float) -> TurnEndEvent:
        """The turn end of sample `index`, which never forked: the main sample's turn ended
        during the prompt (a deadline, a cancel); it generated nothing."""
        now = time.monotonic()
        return TurnEndEvent(
            finish_reason=finish.reason, prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
            completion_tokens=0, queue_ms=queue_ms, ttft_ms=0.0, prompt_ms=0.0, decode_ms=0.0,
            seed=seed, message=finish.message, index=index, final=False,
            t_queued=now, t_slot=now, t_ready=now, t_first_token=now, t_end=now,
        )

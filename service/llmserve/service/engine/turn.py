"""A turn's counters and text state, and how a turn ended."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..domain.events import FinishReason, TokenLogprob
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

    def fork(self) -> Turn:
        """The same turn for another sample (n > 1): same input, its own output."""
        return Turn(
            text=TextStream(self.text.stop),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            t_end_of_input=self.t_end_of_input,
            t_ready=self.t_ready,
        )

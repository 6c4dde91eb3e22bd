"""Picking a sample's next token, and deciding whether its turn ends there.

For each ready row: logprobs (if asked, from the raw logits), bans that keep the
turn going until `min_tokens`, the sampler chain, then the stopping rules (EOG,
stop ids, stop strings through the text stream, max_tokens, the slot's context,
or a context shift). The picker streams the text out through the sample and
returns a `TurnFinish` when the turn is over; the session table applies it.
"""

from __future__ import annotations

import time

import numpy as np
import structlog

from ...domain.events import FinishReason
from ...metrics import Metrics
from ..runner_api import Runner
from .logprobs import log_softmax, token_logprob
from .sample import Sample
from .slot_kv import SlotKV
from .turn import TurnFinish

log = structlog.get_logger("llmserve.token_picker")


class TokenPicker:
    def __init__(
        self, runner: Runner, kv: SlotKV, metrics: Metrics, shift_keep: int | None = None
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.metrics = metrics
        self.sample_s = 0.0  # time in the sampler chains, summed (the executor's StepProfile reads it)
        # Context shift: tokens kept at the start (BOS at least); None: CONTEXT_FULL instead.
        self.shift_keep = None if shift_keep is None else max(shift_keep, int(runner.meta.add_bos))
        self._eog = frozenset(runner.meta.eog_token_ids)
        self._eog_ids = np.array(sorted(self._eog), dtype=np.int64)

    def pick(self, s: Sample, logits: np.ndarray, row: int | None) -> TurnFinish | None:
        """Sample the next token from `logits` (batch row `row`, or saved logits when None).
        None: the turn goes on with `s.next_token`."""
        assert s.turn is not None and s.sampler is not None and s.slot is not None
        turn, stopping, output = s.turn, s.params.stopping, s.params.output
        lp = log_softmax(logits) if output.top_logprobs is not None else None
        t0 = time.perf_counter()
        if turn.completion_tokens < stopping.min_tokens:
            logits = logits.copy()  # other samples of this row must see the raw logits
            logits[self._eog_ids] = -np.inf
            if stopping.stop_token_ids:
                logits[list(stopping.stop_token_ids)] = -np.inf
            token = s.sampler.sample_from(logits)
        elif row is None:
            token = s.sampler.sample_from(logits)
        else:
            token = s.sampler.sample(row, logits)
        self.sample_s += time.perf_counter() - t0
        if token is None:
            return self._nothing_allowed(s)
        logprob = token_logprob(lp, token, output.top_logprobs or 0, self._text) if lp is not None else None
        gap = s.record_picked(token, logprob)
        if gap is not None:
            self.metrics.itl.labels(s.params.surface).observe(gap)
        if token in self._eog and not stopping.ignore_eos:
            return TurnFinish(FinishReason.STOP, token)
        if token in stopping.stop_token_ids:
            return TurnFinish(FinishReason.STOP_SEQUENCE, token, matched_stop_token_id=token)
        text, stop = turn.text.push(self.runner.piece(token, output.include_special))
        if stop is not None:
            s.emit_tokens(text)
            return TurnFinish(FinishReason.STOP_SEQUENCE, token, matched_stop=stop)
        if text:
            s.emit_tokens(text)
        if stopping.max_tokens is not None and turn.completion_tokens >= stopping.max_tokens:
            return TurnFinish(FinishReason.LENGTH, token)
        if s.slot.num_confirmed + 1 > s.n_ctx_per_slot:
            if self.shift_keep is None:
                return TurnFinish(FinishReason.CONTEXT_FULL, token, message="the slot's context is full")
            discard = self.kv.shift(s.slot, self.shift_keep)
            self.metrics.context_shifts.inc()
            log.info("context_shift", seq_id=s.slot.seq_id, keep=self.shift_keep, discard=discard)
        s.continue_with(token)
        return None

    def _nothing_allowed(self, s: Sample) -> TurnFinish:
        """The grammar allows no token the request permits: the turn ends here."""
        assert s.sampler is not None
        if s.sampler.grammar_allows_end():
            message = ("the grammar is complete: it allows only the end of generation, which "
                       "ignore_eos, min_tokens, stop_token_ids or logit_bias forbid")
            return TurnFinish(FinishReason.STOP, None, message=message)
        message = "no token is allowed: the grammar permits only tokens that logit_bias or min_tokens forbid"
        return TurnFinish(FinishReason.ERROR, None, message=message)

    def _text(self, token: int) -> str:
        return self.runner.piece(token, True).decode("utf-8", "replace")

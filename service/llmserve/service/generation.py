"""One generation step: fill the batch from the plan, decode, sample, stream out.

Called by the executor thread only. Decode rows come first (one token per
generating sequence), then prompt chunks; logits are requested only for rows
that are sampled (or when prompt logprobs are asked). After the decode every
sampled row goes through: logprobs (if asked, from the raw logits), bans that
keep the turn going until `min_tokens`, the sampler chain, then the stopping
rules and the text stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import structlog

from .domain import FinishReason, PromptLogprobsEvent, TokenLogprob
from .logprobs import log_softmax, token_logprob
from .metrics import Metrics
from .runner import LlamaRunner
from .scheduler import StepPlan
from .session import Session

log = structlog.get_logger("llmserve.generation")

@dataclass
class StepProfile:
    """Where a generation step's time goes (seconds, summed over steps)."""

    steps: int = 0
    tokens: int = 0
    fill_s: float = 0.0  # building the batch
    decode_s: float = 0.0  # llama_decode
    sample_s: float = 0.0  # sampler chains
    post_s: float = 0.0  # everything after the decode, sampling included

    def as_dict(self) -> dict[str, float]:
        total = self.fill_s + self.decode_s + self.post_s
        host = total - self.decode_s - self.sample_s
        return {
            "steps": self.steps,
            "tokens_per_step": self.tokens / max(self.steps, 1),
            "step_ms": 1000 * total / max(self.steps, 1),
            "decode_ms": 1000 * self.decode_s / max(self.steps, 1),
            "sample_ms": 1000 * self.sample_s / max(self.steps, 1),
            "host_ms": 1000 * host / max(self.steps, 1),
            "host_share": host / total if total else 0.0,
        }


FinishFn = Callable[..., None]
FailFn = Callable[[Session, str, str], None]
ForkFn = Callable[[Session], list[Session]]


class GenerationStep:
    def __init__(
        self,
        runner: LlamaRunner,
        metrics: Metrics,
        finish: FinishFn,
        fail: FailFn,
        fork: ForkFn,
        shift_keep: int | None = None,
    ) -> None:
        self.runner = runner
        # Context shift: tokens kept at the start (BOS at least); None: CONTEXT_FULL instead.
        self.shift_keep = None if shift_keep is None else max(shift_keep, int(runner.meta.add_bos))
        self.metrics = metrics
        self._finish = finish
        self._fail = fail
        self._fork = fork
        self._eog = frozenset(runner.meta.eog_token_ids)
        self._eog_ids = np.array(sorted(self._eog), dtype=np.int64)
        self.profile = StepProfile()

    def run(self, plan: StepPlan, sessions: dict[int, Session]) -> None:
        t0 = time.perf_counter()
        batch = self.runner.batch
        batch.clear()
        entries: list[tuple[Session, list[int], int | None, int]] = []  # session, tokens, sample row, first row
        for key in plan.decode:
            s = sessions[key]
            assert s.slot is not None and s.next_token is not None
            row = batch.add([s.next_token], len(s.slot.tokens), s.slot.seq_id, True)
            entries.append((s, [s.next_token], row, row))
        for key, n in plan.prefill:
            s = sessions[key]
            self._trim_stale_tail(s)
            assert s.slot is not None
            chunk = s.pending[:n]
            wants_logits = s.turn is not None and n == len(s.pending)
            first = batch.num_tokens
            row = batch.add(chunk, len(s.slot.tokens), s.slot.seq_id, wants_logits)
            if s.params.output.prompt_logprobs:
                batch.logits[first : row + 1] = 1
            entries.append((s, chunk, row if wants_logits else None, first))
        t1 = time.perf_counter()
        status = self.runner.decode()
        t2 = time.perf_counter()
        profile = self.profile
        profile.steps += 1
        profile.tokens += batch.num_tokens
        profile.fill_s += t1 - t0
        profile.decode_s += t2 - t1
        if status != 0:
            log.error("decode_failed", status=status, num_tokens=batch.num_tokens)
            for s, _, _, _ in entries:
                self.drop_sequence(s)
                self._fail(s, "INTERNAL", f"llama_decode failed with status {status}")
            return
        for s, tokens, row, first in entries:
            assert s.slot is not None and s.sampler is not None
            s.slot.append(tokens)
            if s.generating:
                s.next_token = None
                if row is not None:
                    self._sample(s, self.runner.logits_row(row), row)
                continue
            del s.pending[: len(tokens)]
            s.sampler.accept(tokens)
            if s.params.output.prompt_logprobs:
                self._prompt_logprobs(s, tokens, first)
            if row is not None:
                logits = self.runner.logits_row(row)
                s.slot.save_logits(len(s.slot.tokens) - 1, logits.copy())
                for sample in [s, *self._fork(s)]:
                    self._sample(sample, logits, row)
        profile.post_s += time.perf_counter() - t2

    def sample_ready(self, sessions: dict[int, Session]) -> None:
        """Turns whose whole prompt is cached with its saved logits: first token, no decode."""
        for s in [s for s in sessions.values() if s.ready_logits is not None]:
            logits, s.ready_logits = s.ready_logits, None
            if s.turn is None or s.slot is None:
                continue
            self._trim_stale_tail(s)
            for sample in [s, *self._fork(s)]:
                self._sample(sample, logits, None)

    # --------------------------------------------------------------- sampling

    def _sample(self, s: Session, logits: np.ndarray, row: int | None) -> None:
        """Sample the next token from `logits` (batch row `row`, or saved logits when None)."""
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
            token = s.sampler.sample(self.runner.ctx, row, logits)
        self.profile.sample_s += time.perf_counter() - t0
        now = time.monotonic()
        if turn.t_first_token is None:
            turn.t_first_token = now
        else:
            self.metrics.itl.observe(now - s.t_last_token)
        s.t_last_token = now
        turn.completion_tokens += 1
        turn.held_ids.append(token)
        if lp is not None:
            turn.held_logprobs.append(token_logprob(lp, token, output.top_logprobs or 0, self._text))
        if token in self._eog and not stopping.ignore_eos:
            self._finish(s, FinishReason.STOP, token)
            return
        if token in stopping.stop_token_ids:
            self._finish(s, FinishReason.STOP_SEQUENCE, token, matched_stop_token_id=token)
            return
        text, stop = turn.stream.push(self.runner.tokenizer.piece(token, output.include_special))
        if stop is not None:
            s.emit_tokens(text)
            self._finish(s, FinishReason.STOP_SEQUENCE, token, matched_stop=stop)
            return
        if text:
            s.emit_tokens(text)
        if stopping.max_tokens is not None and turn.completion_tokens >= stopping.max_tokens:
            self._finish(s, FinishReason.LENGTH, token)
        elif s.slot.num_confirmed + 1 > s.max_context and self.shift_keep is None:
            self._finish(s, FinishReason.CONTEXT_FULL, token, message="the slot's context is full")
        else:
            if s.slot.num_confirmed + 1 > s.max_context:
                self._shift(s)
            s.next_token = token

    def _shift(self, s: Session) -> None:
        """Drop half of what follows the kept tokens, as llama-server does (n_discard = n_left / 2)."""
        assert s.slot is not None and self.shift_keep is not None
        keep = self.shift_keep
        discard = (len(s.slot.tokens) - keep) // 2
        self.runner.seq_shift(s.slot.seq_id, keep, discard)
        s.slot.shift(keep, discard)
        self.metrics.context_shifts.inc()
        log.info("context_shift", seq_id=s.slot.seq_id, keep=keep, discard=discard)

    def _text(self, token: int) -> str:
        return self.runner.tokenizer.piece(token, True).decode("utf-8", "replace")

    def _prompt_logprobs(self, s: Session, tokens: list[int], first: int) -> None:
        """Score each prompt token of the chunk with the row before it."""
        scored: list[TokenLogprob] = []
        previous = s.prompt_logits
        top_n = s.params.output.top_logprobs or 0
        for j, token in enumerate(tokens):
            if previous is not None:
                scored.append(token_logprob(log_softmax(previous), token, top_n, self._text))
            previous = self.runner.logits_row(first + j)
        s.prompt_logits = previous.copy() if previous is not None else None
        if scored:
            s.sink.put(PromptLogprobsEvent(tuple(scored)))

    # ------------------------------------------------------------------ KV

    def _trim_stale_tail(self, s: Session) -> None:
        slot = s.slot
        assert slot is not None
        history = slot.tokens[: slot.num_confirmed]
        start = slot.take_stale_tail()
        if start is not None and not self.runner.seq_rm(slot.seq_id, start, -1):
            # The cache cannot cut there: drop the sequence and prefill it all again.
            log.warning("seq_rm_partial_failed", seq_id=slot.seq_id, position=start)
            self.drop_sequence(s)
            s.pending[:0] = history

    def drop_sequence(self, s: Session) -> None:
        if s.slot is not None:
            self.runner.seq_rm(s.slot.seq_id, -1, -1)
            s.slot.reset()

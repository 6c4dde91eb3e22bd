"""One generation step: fill the batch from the plan, decode, and hand back the rows
whose next token is to be sampled.

Rows: a decode token (and any draft tokens) per generating sequence, a prompt chunk
per prefilling one; in sequence-id order with one KV stream per slot, else decode
rows first; logits are requested only for rows that are sampled (or when prompt logprobs are
asked). After the decode each sequence's slot records what entered the KV, prompt
tokens feed the sampler's history, and prompt logprobs go out. Sampling and the
stopping rules are not done here: the step returns a `StepOutput` and the session
table applies it (`SessionTable.postprocess`). Executor thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import structlog

from ..domain import PromptLogprobsEvent, TokenLogprob
from .logprobs import log_softmax, token_logprob
from .runner_api import Runner
from .scheduler import StepPlan
from .session import Session
from .slot_kv import SlotKV

log = structlog.get_logger("llmserve.step")


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


@dataclass(frozen=True)
class ReadyRow:
    """A sequence whose next token can be sampled from `logits`."""

    session: Session
    logits: np.ndarray
    row: int | None  # the batch row of the last decode; None: saved logits
    turn_start: bool  # the turn's prompt just ended: a turn with n > 1 forks here
    draft: tuple[int, ...] = ()  # draft tokens in rows row+1.. (to verify; not yet in the slot)


@dataclass(frozen=True)
class StepOutput:
    ready: tuple[ReadyRow, ...] = ()
    failed: tuple[Session, ...] = ()  # the decode failed: these sequences were dropped
    error: str = ""


def _by_seq_id(rows: list[tuple[int, int]], sessions: dict[int, Session]) -> list[tuple[int, int]]:
    """(key, prompt tokens; 0 for a decode row) in sequence-id order.

    With one KV stream per slot llama.cpp splits a batch into ubatches of sequences whose
    ids follow one another (`split_equal`, sequential): in id order the decode rows of
    neighbouring slots share one ubatch instead of one ubatch each."""
    return sorted(rows, key=lambda row: sessions[row[0]].slot.seq_id)  # type: ignore[union-attr]


class GenerationStep:
    def __init__(self, runner: Runner, kv: SlotKV, profile: StepProfile, order_by_seq_id: bool = False) -> None:
        """`order_by_seq_id`: rows in sequence-id order (one KV stream per slot); else decode
        and draft rows lead the batch (a unified cache: they stay in its first ubatch)."""
        self.runner = runner
        self.kv = kv
        self.profile = profile
        self.order_by_seq_id = order_by_seq_id

    def run(self, plan: StepPlan, sessions: dict[int, Session]) -> StepOutput:
        t0 = time.perf_counter()
        batch = self.runner.batch
        batch.clear()
        entries: list[tuple[Session, list[int], int | None, int]] = []  # session, tokens, sample row, first row
        granted = dict(plan.drafts)
        drafts: dict[int, tuple[int, ...]] = {}
        rows = [(key, 0) for key in plan.decode] + list(plan.prefill)
        if self.order_by_seq_id:
            rows = _by_seq_id(rows, sessions)
        for key, n in rows:
            s = sessions[key]
            assert s.slot is not None
            if n == 0:  # a decode row and its drafts
                assert s.next_token is not None
                draft = tuple(s.draft[: granted.get(key, 0)])
                row = batch.add([s.next_token, *draft], len(s.slot.tokens), s.slot.seq_id, True)
                first = row - len(draft)
                if draft:
                    batch.logits[first : row + 1] = 1  # every draft row is verified
                    drafts[key] = draft
                entries.append((s, [s.next_token], first, first))
                continue
            s.prefill_again(self.kv.trim_stale_tail(s.slot))
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
            failed = tuple(s for s, _, _, _ in entries)
            for s in failed:
                if s.slot is not None:
                    self.kv.clear(s.slot)
            return StepOutput(failed=failed, error=f"llama_decode failed with status {status}")
        ready: list[ReadyRow] = []
        for s, tokens, row, first in entries:
            assert s.slot is not None and s.sampler is not None
            s.slot.append(tokens)
            if s.generating:
                s.next_token = None
                if row is not None:
                    draft = drafts.get(s.key, ())
                    ready.append(ReadyRow(s, self.runner.logits_row(row), row, turn_start=False, draft=draft))
                continue
            del s.pending[: len(tokens)]
            seen = min(len(tokens), s.num_accepted_ahead)
            s.num_accepted_ahead -= seen
            s.sampler.accept(tokens[seen:])
            if s.params.output.prompt_logprobs:
                self._prompt_logprobs(s, tokens, first, num_seen=seen)
            if row is not None:
                logits = self.runner.logits_row(row)
                s.slot.save_logits(len(s.slot.tokens) - 1, logits.copy())
                ready.append(ReadyRow(s, logits, row, turn_start=True))
        profile.post_s += time.perf_counter() - t2
        return StepOutput(ready=tuple(ready))

    def _prompt_logprobs(self, s: Session, tokens: list[int], first: int, num_seen: int = 0) -> None:
        """Score each prompt token of the chunk with the row before it; the first `num_seen`
        were scored when they first entered the KV (this is a recompute of them)."""
        scored: list[TokenLogprob] = []
        previous = s.prompt_logits
        top_n = s.params.output.top_logprobs or 0
        for j, token in enumerate(tokens):
            if previous is not None and j >= num_seen:
                scored.append(token_logprob(log_softmax(previous), token, top_n, self._text))
            previous = self.runner.logits_row(first + j)
        s.prompt_logits = previous.copy() if previous is not None else None
        if scored:
            s.sink.put(PromptLogprobsEvent(tuple(scored)))

    def _text(self, token: int) -> str:
        return self.runner.piece(token, True).decode("utf-8", "replace")

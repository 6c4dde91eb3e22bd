"""One generation step: fill the batch from the plan, decode, and collect what went in
and which rows are to be sampled.

Rows: a decode token (and any draft tokens) per generating sample, a prompt chunk
per prefilling one; in sequence-id order with one KV stream per slot, else decode
rows first; logits are requested only for rows that are sampled (or when prompt logprobs are
asked). Before the fill, `cut_stale_tails` cuts what each prefilling slot caches past its
history (where that cut fails, the KV is dropped and the history queued to prefill again),
then `seat_by_length` orders the prompts that start in empty slots by length. `run`
changes no sample: it returns a `StepOutput` (with its timings, which the executor adds to
its `StepProfile`) and the session table applies it (`SessionTable.postprocess`:
slots record what entered the KV, prompt tokens feed the sampler, prompt logprobs go out,
ready rows are sampled).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import structlog

from ...domain.requests import AdapterSet
from ..runner_api import Runner
from .sample import Sample
from .scheduler import StepPlan
from .slot_kv import SlotKV

log = structlog.get_logger("llmserve.step")


@dataclass
class StepProfile:
    """Where a generation step's time goes (seconds, summed over steps). The executor's
    record, written by `add_step` alone."""

    steps: int = 0
    tokens: int = 0
    ubatches: int = 0  # graph runs llama_decode made of the steps' batches (Runner.costs.num_ubatches)
    fill_s: float = 0.0  # building the batch
    decode_s: float = 0.0  # llama_decode
    sample_s: float = 0.0  # sampler chains
    post_s: float = 0.0  # everything after the decode, sampling included
    t_decoded: float = 0.0  # perf_counter() when the last decode returned

    def add_step(self, output: StepOutput, post_s: float, sample_s: float) -> None:
        """One generation step: its batch and decode (`output`), the time after its decode
        (`post_s`), and the sampler chains' time so far (`sample_s`: `TokenPicker.sample_s`)."""
        self.steps += 1
        self.tokens += output.num_tokens
        self.ubatches += output.num_ubatches
        self.fill_s += output.fill_s
        self.decode_s += output.decode_s
        self.t_decoded = output.t_decoded
        self.post_s += post_s
        self.sample_s = sample_s

    def as_dict(self) -> dict[str, float]:
        total = self.fill_s + self.decode_s + self.post_s
        host = total - self.decode_s - self.sample_s
        return {
            "steps": self.steps,
            "tokens_per_step": self.tokens / max(self.steps, 1),
            "ubatches_per_step": self.ubatches / max(self.steps, 1),
            "step_ms": 1000 * total / max(self.steps, 1),
            "decode_ms": 1000 * self.decode_s / max(self.steps, 1),
            "sample_ms": 1000 * self.sample_s / max(self.steps, 1),
            "host_ms": 1000 * host / max(self.steps, 1),
            "host_share": host / total if total else 0.0,
        }


@dataclass(frozen=True)
class BatchEntry:
    """One sample's rows in the step's batch."""

    sample: Sample
    tokens: list[int]  # what enters the KV: the decode token, or a prompt chunk
    first: int  # the batch row of tokens[0]
    sample_row: int | None  # the row its next token is sampled from (None: none this step)
    is_decode: bool  # a generating sample's decode row (else a prompt chunk)
    draft: tuple[int, ...] = ()  # draft tokens in rows first+1.. (to verify; not yet in the slot)


@dataclass(frozen=True)
class ReadyRow:
    """A sample whose next token can be sampled from `logits`."""

    sample: Sample
    logits: np.ndarray
    row: int | None  # the batch row of the last decode; None: saved logits
    turn_start: bool  # the turn's prompt just ended: a turn with n > 1 forks here
    draft: tuple[int, ...] = ()  # draft tokens in rows row+1.. (to verify; not yet in the slot)


@dataclass(frozen=True)
class StepOutput:
    entries: tuple[BatchEntry, ...] = ()  # what the batch held, in batch order
    ready: tuple[ReadyRow, ...] = ()
    error: str = ""  # the decode failed: every entry's sequence is to be dropped
    num_tokens: int = 0  # the batch's rows
    num_ubatches: int = 0  # graph runs the runner makes of them
    fill_s: float = 0.0  # building the batch
    decode_s: float = 0.0
    t_decoded: float = 0.0  # perf_counter() when the decode returned


def _by_seq_id(rows: list[tuple[int, int]], samples: dict[int, Sample]) -> list[tuple[int, int]]:
    """(key, prompt tokens; 0 for a decode row) in sequence-id order.

    With one KV stream per slot llama.cpp splits a batch into ubatches of sequences whose
    ids follow one another (`split_equal`, sequential): in id order the decode rows of
    neighbouring slots share one ubatch instead of one ubatch each."""
    return sorted(rows, key=lambda row: samples[row[0]].slot.seq_id)  # type: ignore[union-attr]


def may_trade_slot(s: Sample) -> bool:
    """A prompt that starts in a slot holding none of its history (empty once the step cuts the
    stale tail) may trade it for another such slot (`seat_by_length`): not aLoRA (its KV is the
    base's) and not deterministic (its chunks are fixed from its slot)."""
    return (s.slot is not None and s.slot.num_confirmed == 0 and not s.params.alora_invocation
            and s.canonical_chunk is None)


class GenerationStep:
    def __init__(self, runner: Runner, kv: SlotKV, order_by_seq_id: bool = False, n_ubatch: int = 512) -> None:
        """`order_by_seq_id`: rows in sequence-id order (one KV stream per slot); else decode
        and draft rows lead the batch (a unified cache: they stay in its first ubatch)."""
        self.runner = runner
        self.kv = kv
        self.order_by_seq_id = order_by_seq_id
        self.n_ubatch = n_ubatch

    def cut_stale_tails(self, plan: StepPlan, samples: dict[int, Sample]) -> None:
        """Before the fill: each prefilling slot's KV loses what it caches past the history;
        where it cannot, the KV is dropped and the sample's history queued to prefill again."""
        for key, _ in plan.prefill:
            s = samples[key]
            assert s.slot is not None
            s.prefill_again(self.kv.trim_stale_tail(s.slot))

    def seat_by_length(self, plan: StepPlan, samples: dict[int, Sample]) -> None:
        """After the cut, with one KV stream per slot: the prompts this step starts in empty
        slots trade those slots so that the longer chunk has the lower sequence id. llama.cpp
        splits such a batch into ubatches of consecutive ids with equal tokens each
        (`split_equal`), each a pass over every weight: chunks whose lengths fall as the ids
        rise take one ubatch per distinct length, scattered ones up to one per prompt (16
        prompts of 17-20 tokens: 9 on average, 4 in order). Slots trade only within one
        adapter set; aLoRA and deterministic samples keep theirs."""
        if not self.order_by_seq_id:
            return
        fresh: dict[AdapterSet, list[tuple[int, Sample]]] = {}
        for key, num_tokens in plan.prefill:
            s = samples[key]
            if may_trade_slot(s):
                fresh.setdefault(s.slot.adapters, []).append((num_tokens, s))
        for group in fresh.values():
            slots = sorted((s.slot for _, s in group), key=lambda slot: slot.seq_id)  # type: ignore[union-attr]
            for (_, s), slot in zip(sorted(group, key=lambda g: -g[0]), slots):
                s.move_to(slot)

    def run(self, plan: StepPlan, samples: dict[int, Sample]) -> StepOutput:
        """Fill the batch (reads the samples), decode, collect."""
        t0 = time.perf_counter()
        entries = self._fill(plan, samples)
        t1 = time.perf_counter()
        status = self.runner.decode()
        t2 = time.perf_counter()
        rows = [(e.sample.slot.seq_id if e.sample.slot else -1, len(e.tokens) + len(e.draft)) for e in entries]
        num_ubatches = self.runner.costs.num_ubatches(rows, self.n_ubatch, self.order_by_seq_id)
        num_tokens = self.runner.batch.num_tokens
        error = f"llama_decode failed with status {status}" if status != 0 else ""
        if error:
            log.error("decode_failed", status=status, num_tokens=num_tokens)
        ready = () if error else self._collect(entries)
        return StepOutput(tuple(entries), ready, error, num_tokens=num_tokens, num_ubatches=num_ubatches,
                          fill_s=t1 - t0, decode_s=t2 - t1, t_decoded=t2)

    def _fill(self, plan: StepPlan, samples: dict[int, Sample]) -> list[BatchEntry]:
        batch = self.runner.batch
        batch.clear()
        entries: list[BatchEntry] = []
        granted = dict(plan.drafts)
        rows = [(key, 0) for key in plan.decode] + list(plan.prefill)
        if self.order_by_seq_id:
            rows = _by_seq_id(rows, samples)
        for key, n in rows:
            s = samples[key]
            assert s.slot is not None
            if n == 0:  # a decode row and its drafts
                assert s.next_token is not None
                draft = tuple(s.draft[: granted.get(key, 0)])
                row = batch.add([s.next_token, *draft], len(s.slot.tokens), s.slot.seq_id, True)
                first = row - len(draft)
                if draft:
                    batch.logits[first : row + 1] = 1  # every draft row is verified
                entries.append(BatchEntry(s, [s.next_token], first, first, True, draft))
                continue
            chunk = s.pending[:n]
            wants_logits = s.turn is not None and n == len(s.pending)
            first = batch.num_tokens
            row = batch.add(chunk, len(s.slot.tokens), s.slot.seq_id, wants_logits)
            if s.params.output.prompt_logprobs:
                batch.logits[first : row + 1] = 1
            entries.append(BatchEntry(s, chunk, first, row if wants_logits else None, False))
        return entries

    def _collect(self, entries: list[BatchEntry]) -> tuple[ReadyRow, ...]:
        """The rows to sample: each decode row (with its drafts), and each prompt that ended."""
        return tuple(
            ReadyRow(e.sample, self.runner.logits_row(e.sample_row), e.sample_row, not e.is_decode, e.draft)
            for e in entries
            if e.sample_row is not None
        )

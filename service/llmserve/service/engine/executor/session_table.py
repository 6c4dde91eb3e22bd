"""The executor's table of Generate sessions: their lifecycle from open to release. Opening, input and turn ends,
cancels, closes, admission to slots (priority, then FIFO), deadlines, forking a turn into n samples
(`Session.fork_samples`), applying each step's output (recording what entered the KV, sampling the ready rows,
ending turns), saving/restoring named sessions. `sessions`: the streams by key; `samples`: every sample."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

import structlog

from ...domain.errors import FailureKind, GrammarError
from ...domain.events import FinishReason, SessionFailed
from ...domain.requests import SamplingParams
from ...domain.snapshots import SavedSession
from ..commands import AddInput, Cancel, Close, Open
from ..runner_api import Runner, TokenSampler
from ..session_store import SessionStore
from . import alora
from .adapter_residency import AdapterResidency, AdapterUnavailable
from .admission import Admission
from .allocator import Slot, SlotAllocator
from .draft_verifier import DraftVerifier
from .generation_step import StepOutput, may_trade_slot
from .logprobs import score_prompt_chunk
from .sample import Sample
from .scheduler import SeqDemand
from .session import Session
from .slot_kv import SlotKV
from .speculation import SeqSpeculation
from .token_picker import TokenPicker
from .turn import TurnFinish

log = structlog.get_logger("llmserve.sessions")


class SessionTable:
    def __init__(self, runner: Runner, allocator: SlotAllocator, kv: SlotKV, picker: TokenPicker, keys: Iterator[int],
                 store: SessionStore | None, verifier: DraftVerifier | None = None,
                 adapters: AdapterResidency | None = None, *, max_sets: int) -> None:
        """`verifier`: drafts (None: off); `adapters`: the LoRA adapters loaded; `max_sets`: see admission.py."""
        self.runner, self.verifier, self.store, self.allocator, self.kv = runner, verifier, store, allocator, kv
        self.adapters, self.picker, self.keys = adapters or AdapterResidency(runner), picker, keys
        self.n_ctx_per_slot = allocator.n_ctx_per_slot
        self.sessions: dict[int, Session] = {}
        self.samples: dict[int, Sample[Session]] = {}  # every session's samples: the main one has the session's key
        self.waiting: deque[Session] = deque()
        self.admission = Admission(allocator, kv, self.sessions, self.waiting, picker.metrics, max_sets)
        self._eog = tuple(runner.meta.eog_token_ids)

    # ------------------------------------------------------------ commands

    def handle(self, command: object) -> None:
        if isinstance(command, Open):
            self._open(command)
            return
        session = self.sessions.get(command.key)  # type: ignore[attr-defined]
        if session is None:
            return
        if isinstance(command, AddInput):  # waits for the running turn, or for a saved session's KV
            if session.main.turn is not None or session.samples_open or session.restore is not None:
                session.later.append((command.tokens, command.end_of_turn, command.replace))
            else:
                self._accept_input(session, command.tokens, command.end_of_turn, command.replace)
        elif isinstance(command, (Cancel, Close)):  # a closed stream's open turn ends CANCELLED first
            for sample in (*session.samples[1:], session.main):
                if sample.turn is not None:
                    self._finish(sample, TurnFinish(FinishReason.CANCELLED, sample.next_token))
            if isinstance(command, Close):
                self._release(session)

    def _open(self, command: Open) -> None:
        params, t_open = command.params, time.monotonic()
        try:  # adapters resident, none being unloaded (in queue order with the unloads)
            self.adapters.check(params.adapters, (s.params for s in self.sessions.values()))
            sampler = self._sampler(params.sampling, params.stopping.ignore_eos, command.grammar)
        except (GrammarError, AdapterUnavailable) as exc:  # the transport checks first; this is the backstop
            busy = isinstance(exc, AdapterUnavailable) and exc.retry_after_s is not None  # no room now
            command.sink.put(SessionFailed(FailureKind.BUSY if busy else FailureKind.INVALID, str(exc)))
            if params.session_id and self.store is not None:
                self.store.settle(params.session_id)
            return
        chunk = self.allocator.canonical_chunk if params.sampling.deterministic else None  # no drafts: one shape
        session = Session(command.key, params, command.sink, self.n_ctx_per_slot, command.deadline, sampler,
                          self._speculation() if chunk is None else None, t_open, chunk)
        session.grammar = command.grammar
        session.restore, session.conversation = command.restore, command.conversation
        self.sessions[command.key] = session
        self.samples[command.key] = session.main
        self.waiting.append(session)

    def _speculation(self) -> SeqSpeculation | None:
        return SeqSpeculation(self.verifier.settings) if self.verifier is not None else None

    def _sampler(self, sampling: SamplingParams, ignore_eos: bool, grammar: object | None) -> TokenSampler:
        return self.runner.new_sampler(sampling, self.n_ctx_per_slot, self._eog if ignore_eos else (), grammar)

    def _accept_input(self, session: Session, tokens: tuple[int, ...], end_of_turn: bool, replace: bool) -> None:
        main = session.main
        if replace:
            main.replace_history(tokens)
        elif tokens:
            main.add_input(tokens)
        if not end_of_turn:
            return
        session.begin_turn()
        if main.overflowed or main.num_context_tokens > self.n_ctx_per_slot:
            main.drop_input()
            message = f"history plus input exceed the slot context of {self.n_ctx_per_slot} tokens"
            self._finish(main, TurnFinish(FinishReason.CONTEXT_FULL, None, message=message))
        elif not main.pending and main.num_context_tokens == 0:
            self.fail(session, FailureKind.INVALID, "the turn has no input")

    # ----------------------------------------------------------- each step

    def demands(self) -> list[SeqDemand]:
        """What each sample with a slot could put in the next decode (reads only)."""
        return [
            self.verifier.demand(s) if self.verifier and s.generating else SeqDemand(
                s.key, s.generating, s.num_prefill_ready, 0, s.slot.seq_id, adapters=alora.adapters_now(s),
                alone=s.canonical_chunk is not None, reseatable=may_trade_slot(s))
            for s in self.samples.values() if s.slot is not None and not s.session.paused
        ]

    def propose_drafts(self, no_drafts_after: float) -> None:
        """Speculation: each generating sample drafts the tokens it hopes the step accepts;
        none whose call's deadline is before `no_drafts_after` (draft steps are the slow ones)."""
        if self.verifier is not None:
            for s in self.samples.values():
                in_time = (s.session.deadline or no_drafts_after) >= no_drafts_after
                if s.slot is not None and not s.session.paused and s.generating and in_time:
                    self.verifier.propose(s)
                else:
                    s.set_draft([])

    def postprocess(self, output: StepOutput) -> None:
        """Apply a step's output: record what entered each slot, sample every ready row
        (a failed decode: the sequences in it are dropped and their sessions fail)."""
        if output.error:
            for e in output.entries:
                if e.sample.slot is not None:
                    self.kv.clear(e.sample.slot)
            for key in dict.fromkeys(e.sample.session.key for e in output.entries):
                if key in self.sessions:  # not failed already
                    self.fail(self.sessions[key], FailureKind.INTERNAL, output.error)
            return
        for e in output.entries:
            if e.is_decode:
                e.sample.record_decode(e.tokens[0])
                continue
            logits = self.runner.logits_row(e.sample_row) if e.sample_row is not None else None
            num_seen = e.sample.record_prefill(e.tokens, logits)
            if e.sample.params.output.prompt_logprobs:
                score_prompt_chunk(self.runner, e.sample, e.tokens, e.first, num_seen)
        for ready in output.ready:
            if self.verifier is not None and ready.sample.draft and not ready.turn_start:
                if (finish := self.verifier.verify(ready)) is not None:
                    self._finish(ready.sample, finish)
                continue
            samples = [ready.sample, *self._fork(ready.sample)] if ready.turn_start else [ready.sample]
            for sample in samples:
                self._pick(sample, ready.logits, ready.row)

    def sample_ready(self) -> None:
        """Turns whose whole prompt is cached with its saved logits: first token, no decode."""
        for s in [s for s in self.samples.values() if s.ready_logits is not None]:
            logits = s.take_ready_logits()
            if s.turn is None or s.slot is None:
                continue
            if s.prefill_again(self.kv.trim_stale_tail(s.slot)):
                continue  # the KV was dropped: the prefill's last row gives the logits
            for sample in [s, *self._fork(s)]:
                self._pick(sample, logits, None)

    def _pick(self, s: Sample, logits: object, row: int | None) -> None:
        finish = self.picker.pick(s, logits, row)  # type: ignore[arg-type]
        if finish is not None:
            self._finish(s, finish)

    def _finish(self, sample: Sample, finish: TurnFinish) -> None:
        session = sample.session
        if session.end_turn(sample, finish, self.kv):  # a forked sample lives for one turn
            self.samples.pop(sample.key, None)
        self._accept_later(session)

    def _accept_later(self, session: Session) -> None:
        while session.later and session.main.turn is None and session.samples_open == 0:
            self._accept_input(session, *session.later.popleft())

    def _fork(self, sample: Sample) -> list[Sample]:
        """The first logits of a turn: with n > 1 its main sample forks the others."""
        session = sample.session
        if sample is not session.main:
            return []
        forked = session.fork_samples(self.keys, self.kv, lambda sampling, ignore_eos: self._sampler(
            sampling, ignore_eos, session.grammar))
        self.samples.update((s.key, s) for s in forked)
        return forked

    # ------------------------------------------------------- slots and saves

    def admit(self) -> bool:
        """Give free slots to waiting sessions (admission.py; paused streams may give theirs up)."""
        return self.admission.admit(self._accept_later)

    def expire_readers(self, reader_timeout_s: float | None) -> None:
        self.admission.expire_readers(reader_timeout_s, self.fail)

    def _save(self, session: Session) -> None:
        """A named session ends: copy its KV state out for the store's writer thread."""
        session_id = session.params.session_id
        if self.store is None or not session_id:
            return
        main = session.main
        slot = main.slot
        if slot is None and session.preempted_history:  # its KV went with the slot: restoring prefills it again
            n = session.preempted_history
            self.store.save_async(SavedSession(session_id, tuple(main.pending[:n]), tuple(main.pending[n:]),
                                               session.saved_chat(), b"", session.params.adapters))
            return
        history: tuple[int, ...] = tuple(slot.tokens[: slot.num_confirmed]) if slot is not None else ()
        if slot is None or not history:  # nothing in it: the saved file stays as it was
            self.store.settle(session_id)
            return
        history, state = self.kv.export(slot)
        pending = (*main.pending, *([main.next_token] if main.next_token is not None else []))
        self.store.save_async(SavedSession(session_id, history, pending, session.saved_chat(), state, main.params.adapters))

    def _release(self, session: Session) -> None:
        """The stream is gone: free its slots now; their KV stays as a prefix cache."""
        self._save(session)
        self.sessions.pop(session.key, None)
        for sample in session.samples:
            self.samples.pop(sample.key, None)
        if session.main.slot is None:
            try:
                self.waiting.remove(session)
            except ValueError:
                pass
        session.release(self.kv, self.allocator)

    def fail(self, session: Session, kind: FailureKind, message: str) -> None:
        session.sink.put(SessionFailed(kind, message))
        self._release(session)

    def fail_busy(self, kind: FailureKind, message: str) -> None:
        """After a fault: end every session holding a slot, and drop its sequence."""
        for s in list(self.sessions.values()):
            if s.main.slot is not None:
                self.kv.clear(s.main.slot)
                self.fail(s, kind, message)

    def fail_key(self, key: int, kind: FailureKind, message: str) -> None:
        session = self.sessions.get(key)
        if session is not None:
            self.fail(session, kind, message)

    def fail_all(self, kind: FailureKind, message: str) -> None:
        for s in list(self.sessions.values()):
            self.fail(s, kind, message)

    def slot_states(self) -> Iterator[tuple[Slot, bool]]:
        """Every slot, and whether the sample on it is paused (its client stopped reading)."""
        paused = {s.slot.seq_id for s in self.samples.values() if s.slot is not None and s.session.paused}
        for slot in self.allocator.slots:
            yield slot, slot.seq_id in paused

    def num_prefill_tokens_waiting(self) -> int:
        """Input of open sessions not yet in the KV."""
        return sum(len(x.pending) for s in self.sessions.values() for x in s.samples)

    def turn_tokens_left(self) -> tuple[int, ...]:
        """Per sample in a turn on a slot, read by its client, the tokens it may still generate
        (max_tokens, else the slot's room), ascending: when slots free, as the limits tell.
        Other slots are free, or admission would take them for a new call (paused, idle)."""
        return tuple(sorted(_tokens_left(x) for s in self.sessions.values() for x in s.samples
                            if x.turn is not None and x.slot is not None and not s.paused))

    # ------------------------------------------------------------ deadlines

    def expire_deadlines(self, margin_s: float) -> None:
        """End sessions whose deadline falls within `margin_s` (before the next step could finish)."""
        horizon = time.monotonic() + margin_s
        for s in list(self.sessions.values()):
            if s.deadline is not None and s.deadline <= horizon:
                s.later.clear()
                for sample in (*s.samples[1:], s.main):
                    if sample.turn is not None:
                        expired = TurnFinish(FinishReason.DEADLINE, sample.next_token, message="the call's deadline expired")
                        self._finish(sample, expired)
                self.fail(s, FailureKind.DEADLINE, "the call's deadline expired")


def _tokens_left(sample: Sample) -> int:
    assert sample.turn is not None
    room = max(sample.n_ctx_per_slot - sample.num_context_tokens, 0)
    max_tokens = sample.params.stopping.max_tokens
    return room if max_tokens is None else min(room, max(max_tokens - sample.turn.completion_tokens, 0))

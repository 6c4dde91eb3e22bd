"""The executor's table of Generate sessions: their lifecycle from open to release.

Opening, input and turn ends, cancels, closes, admission to slots (priority, then
FIFO), deadlines, forking a turn into n samples, and saving/restoring named
sessions. The executor thread owns it: every method runs on that thread, between
decode steps.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import structlog

from .allocator import SlotAllocator
from .commands import AddInput, Cancel, Close, Open
from .domain import FinishReason, SamplingParams, SessionFailed
from .generation import GenerationStep
from .metrics import Metrics
from .runner import LlamaRunner
from .sampler import GrammarError, Sampler
from .session import Session
from .session_store import SavedSession, SessionStore
from .slot_kv import SlotKV

log = structlog.get_logger("llmserve.sessions")


class SessionTable:
    def __init__(
        self,
        runner: LlamaRunner,
        n_parallel: int,
        n_ctx_per_slot: int,
        metrics: Metrics,
        shift_keep: int | None,
        store: SessionStore | None,
    ) -> None:
        self.runner = runner
        self.n_ctx_per_slot = n_ctx_per_slot
        self.store = store
        self.allocator = SlotAllocator(n_parallel, n_ctx_per_slot)
        self.kv = SlotKV(runner, self.allocator)
        self.generation = GenerationStep(runner, metrics, self._finish, self.fail, self._fork, shift_keep)
        self.keys = itertools.count(1)
        self.sessions: dict[int, Session] = {}
        self.waiting: deque[Session] = deque()
        self._eog = frozenset(runner.meta.eog_token_ids)

    def handle(self, command: object) -> None:
        if isinstance(command, Open):
            self._open(command)
        else:
            session = self.sessions.get(command.key)  # type: ignore[attr-defined]
            if session is None:
                return
            if isinstance(command, AddInput):
                if session.turn is not None or session.samples_open:
                    session.later.append((command.tokens, command.end_of_turn, command.replace))
                else:
                    self._accept_input(session, command.tokens, command.end_of_turn, command.replace)
            elif isinstance(command, Cancel):
                for sample in (*session.children, session):
                    if sample.turn is not None:
                        self._finish(sample, FinishReason.CANCELLED, sample.next_token)
            elif isinstance(command, Close):
                session.chat = command.chat
                self._release(session)


    def _open(self, command: Open) -> None:
        params = command.params
        session = Session(command.key, params, command.sink, self.n_ctx_per_slot, command.deadline)
        try:
            session.sampler = self._sampler(params.sampling, params.stopping.ignore_eos)
        except GrammarError as exc:  # the transport checks first; this is the backstop
            command.sink.put(SessionFailed("INVALID_ARGUMENT", str(exc)))
            return
        session.restore = command.restore
        self.sessions[command.key] = session
        self.waiting.append(session)


    def _sampler(self, sampling: SamplingParams, ignore_eos: bool = False) -> Sampler:
        banned = tuple(self._eog) if ignore_eos else ()
        return Sampler(sampling, self.runner.vocab, self.runner.n_vocab, self.n_ctx_per_slot, banned)


    def _accept_input(self, session: Session, tokens: tuple[int, ...], end_of_turn: bool, replace: bool) -> None:
        if replace:
            session.replace_history(tokens)
        elif tokens:
            session.add_input(tokens)
        if not end_of_turn:
            return
        session.begin_turn()
        if session.overflowed:
            session.pending.clear()
            message = f"history plus input exceed the slot context of {self.n_ctx_per_slot} tokens"
            self._finish(session, FinishReason.CONTEXT_FULL, None, message=message)
        elif not session.pending and session.num_context_tokens == 0:
            self.fail(session, "INVALID_ARGUMENT", "the turn has no input")


    def _finish(self, session: Session, reason: FinishReason, last_token: int | None, **kw: object) -> None:
        session.finish_turn(reason, last_token, **kw)  # type: ignore[arg-type]
        if session.parent is not None:  # a forked sample lives for one turn
            self._release(session)
        group = session.group
        while group.later and group.turn is None and group.samples_open == 0:
            tokens, end_of_turn, replace = group.later.popleft()
            self._accept_input(group, tokens, end_of_turn, replace)


    def _fork(self, parent: Session) -> list[Session]:
        """First logits of a turn with n > 1: copy the KV into the reserved slots."""
        if not parent.reserved or parent.turn is None or parent.turn.t_first_token is not None:
            return []
        assert parent.slot is not None
        children = []
        for slot in parent.reserved:
            self.kv.copy(parent.slot, slot)
            child = parent.fork(next(self.keys), slot, self._sampler)
            self.sessions[child.key] = child
            children.append(child)
        parent.reserved.clear()
        return children


    def _resume(self, session: Session) -> None:
        """A saved session gets a slot holding its KV."""
        saved, session.restore = session.restore, None
        assert saved is not None
        session.resume(*self.kv.restore(saved))


    def _save(self, session: Session) -> None:
        """A named session ends: copy its KV state out for the store's writer thread."""
        slot = session.slot
        if self.store is None or not session.params.session_id or slot is None or session.parent is not None:
            return
        history, state = self.kv.export(slot)
        pending = (*session.pending, *([session.next_token] if session.next_token is not None else []))
        self.store.save_async(SavedSession(session.params.session_id, history, pending, session.chat, state))


    def _release(self, session: Session) -> None:
        """The stream is gone: free the slot now; its KV stays as a prefix cache."""
        self._save(session)
        self.sessions.pop(session.key, None)
        if session.parent is not None and session in session.parent.children:
            session.parent.children.remove(session)
        for child in list(session.children):
            self._release(child)
        session.children.clear()
        for slot in session.reserved:
            self.allocator.free(slot)
        session.reserved.clear()
        if session.slot is not None:
            if session.slot.shifted:  # positions moved: not a prefix of anything any more
                self.kv.clear(session.slot)
                session.slot.shifted = False
            self.allocator.free(session.slot)
            session.slot = None
        else:
            try:
                self.waiting.remove(session)
            except ValueError:
                pass
        if session.sampler is not None:
            session.sampler.free()
            session.sampler = None


    def fail(self, session: Session, status: str, message: str) -> None:
        session.sink.put(SessionFailed(status, message))
        self._release(session)


    def admit(self) -> bool:
        """Give free slots to waiting sessions that have input: higher priority first, then FIFO."""
        admitted = False
        for session in sorted(self.waiting, key=lambda s: (-s.params.priority, s.key)):
            need = session.params.num_samples
            if self.allocator.num_idle < need:
                break
            if session.restore is not None:
                self.waiting.remove(session)
                self._resume(session)
            elif session.pending:
                self.waiting.remove(session)
                session.attach(self.allocator.allocate(session.pending), self.allocator.reusable)
                session.reserved = [self.allocator.allocate(()) for _ in range(need - 1)]
                admitted = True
        return admitted


    def idle_timeout(self, step_s: float) -> float | None:
        """How long the idle loop may sleep: paused sessions resume when their client
        reads (polled), and deadlines must be caught in time."""
        if any(s.paused for s in self.sessions.values()):
            return 0.005
        deadlines = [s.deadline for s in self.sessions.values() if s.deadline is not None]
        if not deadlines:
            return None
        return max(min(deadlines) - time.monotonic() - 1.5 * step_s - 0.005, 0.0)


    def expire_deadlines(self, step_s: float) -> None:
        """End sessions whose deadline falls before the next step could finish."""
        horizon = time.monotonic() + 1.5 * step_s + 0.005
        for s in [s for s in self.sessions.values() if s.parent is None]:
            if s.deadline is not None and s.deadline <= horizon:
                s.later.clear()
                for sample in (*s.children, s):
                    if sample.turn is not None:
                        self._finish(sample, FinishReason.DEADLINE, sample.next_token, message="the call's deadline expired")
                self.fail(s, "DEADLINE_EXCEEDED", "the call's deadline expired")


    def fail_busy(self, status: str, message: str) -> None:
        for s in [s for s in self.sessions.values() if s.parent is None]:
            if s.slot is not None:
                self.generation.drop_sequence(s)
                self.fail(s, status, message)


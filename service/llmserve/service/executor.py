"""The batching executor: one thread owns the llama context and runs every step.

The transport calls the thread-safe methods (`open_session`, `add_input`,
`cancel`, `close`, `embed`); each only puts a command on a queue. The thread
drains that queue once per step, so a cancel or a disconnect frees the slot
before the next decode. Each step: admit waiting sessions to free slots, ask the
scheduler what this `llama_decode` holds, fill the batch, decode, then sample and
stream out. Events go to each request's sink, which never blocks this thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque

import numpy as np
import structlog

from .allocator import SlotAllocator, common_prefix_length
from .commands import STOP, AddInput, Cancel, Close, Embed, ExecutorSnapshot, Open, SlotSnapshot
from .domain import EmbedInput, EmbedResult, FinishReason, SamplingParams, SessionFailed, SessionParams
from .generation import GenerationStep
from .metrics import Metrics
from .runner import LlamaRunner
from .sampler import GrammarError, Sampler
from .scheduler import Scheduler, SeqDemand
from .session import EventSink, Session
from .session_store import SavedSession, SessionStore

log = structlog.get_logger("llmserve.executor")




class Executor:
    def __init__(
        self,
        runner: LlamaRunner,
        n_parallel: int,
        n_ctx_per_slot: int,
        metrics: Metrics | None = None,
        shift_keep: int | None = None,
        store: SessionStore | None = None,
    ) -> None:
        """`shift_keep`: tokens kept at the start on a context shift; None disables shifting.
        `store`: where named sessions are saved when they end."""
        self.store = store
        cfg = runner.config
        self.metrics = metrics or Metrics()
        self.runner = runner
        self.n_parallel = n_parallel
        self.n_ctx_per_slot = n_ctx_per_slot
        self.allocator = SlotAllocator(n_parallel, n_ctx_per_slot)
        self.scheduler = Scheduler(cfg.n_batch, cfg.n_ubatch, cfg.max_embed_seqs)
        self._eog = frozenset(runner.meta.eog_token_ids)
        self._generation = GenerationStep(runner, self.metrics, self._finish, self._fail, self._fork, shift_keep)
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._keys = itertools.count(1)
        self._sessions: dict[int, Session] = {}
        self._waiting: deque[Session] = deque()
        self._embeds: deque[tuple[EmbedInput, EventSink]] = deque()
        self._num_steps = 0
        self._step_s = 0.02  # moving average of a step's duration (deadline margin)
        self.snapshot = ExecutorSnapshot()
        self._thread = threading.Thread(target=self._run, name="llmserve-executor", daemon=True)

    # ------------------------------------------------ thread-safe API (transport)

    def start(self) -> None:
        self._publish()
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current step; open sessions end UNAVAILABLE."""
        self._commands.put(STOP)
        self._thread.join(timeout)

    def open_session(
        self, params: SessionParams, sink: EventSink, deadline: float | None = None, restore: SavedSession | None = None
    ) -> int:
        """Open a session; `deadline` (time.monotonic) ends it with DEADLINE in time to tell the client;
        `restore` resumes a saved session."""
        key = next(self._keys)
        self._commands.put(Open(key, params, sink, deadline, restore))
        return key

    def add_input(self, key: int, tokens: tuple[int, ...], end_of_turn: bool, replace: bool = False) -> None:
        """Append input (or, with `replace`, give the whole rendered history: chat)."""
        self._commands.put(AddInput(key, tokens, end_of_turn, replace))

    def cancel(self, key: int) -> None:
        self._commands.put(Cancel(key))

    def close(self, key: int, chat: tuple[tuple[str, str], ...] | None = None) -> None:
        self._commands.put(Close(key, chat))

    def embed(self, inputs: tuple[EmbedInput, ...], sink: EventSink) -> None:
        self._commands.put(Embed(inputs, sink))

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while self._drain(block=False):
                self._expire_deadlines()
                if self._admit():
                    self._publish()  # slots taken before the first token streams out
                self._generation.sample_ready(self._sessions)
                try:
                    worked = self._step()
                except Exception:  # a bug: fail the sessions involved, keep serving
                    log.exception("executor_step_failed")
                    self._fail_busy_sessions("INTERNAL", "internal error in the executor")
                    worked = True
                self._publish()
                if not worked and not self._drain(block=True, timeout=self._idle_timeout()):
                    break
        finally:
            self._shutdown_sessions()

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Handle queued commands (wait up to `timeout` for one if `block`); False once stopped."""
        while True:
            try:
                command = self._commands.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if command is STOP:
                return False
            self._handle(command)

    def _handle(self, command: object) -> None:
        if isinstance(command, Open):
            self._open(command)
        elif isinstance(command, Embed):
            self._embeds.extend((item, command.sink) for item in command.inputs)
        else:
            session = self._sessions.get(command.key)  # type: ignore[attr-defined]
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
        self._sessions[command.key] = session
        self._waiting.append(session)

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
            self._fail(session, "INVALID_ARGUMENT", "the turn has no input")

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
            self.runner.seq_rm(slot.seq_id, -1, -1)
            self.runner.seq_cp(parent.slot.seq_id, slot.seq_id)
            slot.tokens[:] = parent.slot.tokens
            slot.num_confirmed = len(slot.tokens)
            child = parent.fork(next(self._keys), slot, self._sampler)
            self._sessions[child.key] = child
            children.append(child)
        parent.reserved.clear()
        return children

    def _resume(self, session: Session) -> None:
        """A saved session gets a slot: reuse the KV if a slot still holds it, else load it."""
        saved = session.restore
        assert saved is not None
        session.restore = None
        slot = self.allocator.allocate(saved.tokens)
        if saved.tokens and common_prefix_length(slot.tokens, saved.tokens) == len(saved.tokens):
            del slot.tokens[len(saved.tokens) :]  # the rest is another continuation: trim it
            slot.save_logits(-1, None)
            self.runner.seq_rm(slot.seq_id, len(saved.tokens), -1)
        else:
            self.runner.seq_rm(slot.seq_id, -1, -1)
            slot.reset()
            if saved.tokens and self.runner.set_seq_state(slot.seq_id, saved.state):
                slot.tokens[:] = saved.tokens
            elif saved.tokens:
                log.warning("session_state_rejected", session_id=saved.session_id, detail="llama.cpp refused the state")
                self.runner.seq_rm(slot.seq_id, -1, -1)
                saved = None
        session.resume(slot, saved)

    def _save(self, session: Session) -> None:
        """A named session ends: copy its KV state out for the store's writer thread."""
        slot = session.slot
        if self.store is None or not session.params.session_id or slot is None or session.parent is not None:
            return
        history = slot.tokens[: slot.num_confirmed]
        if slot.take_stale_tail() is not None:
            self.runner.seq_rm(slot.seq_id, len(history), -1)
        pending = [*session.pending, *([session.next_token] if session.next_token is not None else [])]
        state = self.runner.seq_state(slot.seq_id)
        self.store.save_async(SavedSession(session.params.session_id, tuple(history), tuple(pending), session.chat, state))

    def _release(self, session: Session) -> None:
        """The stream is gone: free the slot now; its KV stays as a prefix cache."""
        self._save(session)
        self._sessions.pop(session.key, None)
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
                self._generation.drop_sequence(session)
                session.slot.shifted = False
            self.allocator.free(session.slot)
            session.slot = None
        else:
            try:
                self._waiting.remove(session)
            except ValueError:
                pass
        if session.sampler is not None:
            session.sampler.free()
            session.sampler = None

    def _fail(self, session: Session, status: str, message: str) -> None:
        session.sink.put(SessionFailed(status, message))
        self._release(session)

    def _admit(self) -> bool:
        """Give free slots to waiting sessions that have input: higher priority first, then FIFO."""
        admitted = False
        for session in sorted(self._waiting, key=lambda s: (-s.params.priority, s.key)):
            need = session.params.num_samples
            if self.allocator.num_idle < need:
                break
            if session.restore is not None:
                self._waiting.remove(session)
                self._resume(session)
            elif session.pending:
                self._waiting.remove(session)
                session.attach(self.allocator.allocate(session.pending), self.allocator.reusable)
                session.reserved = [self.allocator.allocate(()) for _ in range(need - 1)]
                admitted = True
        return admitted

    def _idle_timeout(self) -> float | None:
        """How long the idle loop may sleep: paused sessions resume when their client
        reads (polled), and deadlines must be caught in time."""
        if any(s.paused for s in self._sessions.values()):
            return 0.005
        deadlines = [s.deadline for s in self._sessions.values() if s.deadline is not None]
        if not deadlines:
            return None
        return max(min(deadlines) - time.monotonic() - 1.5 * self._step_s - 0.005, 0.0)

    def _expire_deadlines(self) -> None:
        """End sessions whose deadline falls before the next step could finish."""
        horizon = time.monotonic() + 1.5 * self._step_s + 0.005
        for s in [s for s in self._sessions.values() if s.parent is None]:
            if s.deadline is not None and s.deadline <= horizon:
                s.later.clear()
                for sample in (*s.children, s):
                    if sample.turn is not None:
                        self._finish(sample, FinishReason.DEADLINE, sample.next_token, message="the call's deadline expired")
                self._fail(s, "DEADLINE_EXCEEDED", "the call's deadline expired")

    # ------------------------------------------------------------- one step

    def _step(self) -> bool:
        demands = [
            SeqDemand(s.key, s.generating, s.num_prefill_ready)
            for s in self._sessions.values()
            if s.slot is not None and not s.paused
        ]
        sizes = [len(item.tokens) for item, _ in itertools.islice(self._embeds, self.scheduler.max_embed_seqs)]
        plan = self.scheduler.plan(demands, sizes)
        if plan.is_empty:
            return False
        self._num_steps += 1
        start = time.perf_counter()
        if plan.is_embedding:
            kind = "embed"
            num_tokens = sum(sizes[: plan.num_embed])
            self._run_embeddings(plan.num_embed)
        else:
            kind = "generate"
            num_tokens = plan.num_tokens
            self._generation.run(plan, self._sessions)
        elapsed = time.perf_counter() - start
        self._step_s = 0.9 * self._step_s + 0.1 * elapsed
        self.metrics.step_duration.labels(kind).observe(elapsed)
        self.metrics.batch_tokens.labels(kind).observe(num_tokens)
        return True

    def _run_embeddings(self, count: int) -> None:
        items = [self._embeds.popleft() for _ in range(count)]
        try:
            vectors = self.runner.embed([item.tokens for item, _ in items], first_seq_id=self.n_parallel)
        except RuntimeError as exc:
            log.error("embedding_step_failed", error=str(exc))
            for _, sink in items:
                sink.put(SessionFailed("INTERNAL", str(exc)))
            return
        for (item, sink), vector in zip(items, vectors):
            if item.normalize:
                norm = float(np.linalg.norm(vector))
                if norm > 0.0:
                    vector /= norm
            sink.put(EmbedResult(item.index, vector, len(item.tokens), item.truncated))
        self.metrics.embeddings.inc(len(items))
        self.metrics.embedding_tokens.inc(sum(len(item.tokens) for item, _ in items))

    # ------------------------------------------------------------ bookkeeping

    def _fail_busy_sessions(self, status: str, message: str) -> None:
        for s in [s for s in self._sessions.values() if s.parent is None]:
            if s.slot is not None:
                self._generation.drop_sequence(s)
                self._fail(s, status, message)

    def _shutdown_sessions(self) -> None:
        for s in [s for s in self._sessions.values() if s.parent is None]:
            self._fail(s, "UNAVAILABLE", "the server is shutting down")
        while self._embeds:
            _, sink = self._embeds.popleft()
            sink.put(SessionFailed("UNAVAILABLE", "the server is shutting down"))
        self._publish()

    def _publish(self) -> None:
        paused = {s.slot.seq_id for s in self._sessions.values() if s.slot is not None and s.paused}
        snapshot = self.snapshot = ExecutorSnapshot(
            slots=tuple(
                SlotSnapshot(slot.seq_id, slot.busy, len(slot.tokens), slot.seq_id in paused)
                for slot in self.allocator.slots
            ),
            num_sessions=len(self._sessions),
            num_waiting=len(self._waiting),
            num_embed_queued=len(self._embeds),
            num_steps=self._num_steps,
            num_kv_tokens=self.allocator.num_cached_tokens,
        )
        self.metrics.observe_snapshot(snapshot, self.n_parallel * self.n_ctx_per_slot)

"""Who holds a slot: admission of waiting sessions, and preemption of streams nobody reads.

Waiting sessions get free slots by priority, then FIFO. A session whose client stopped
reading (its events pile up: `Session.paused`), or that sits between turns, would keep
its slot for as long as the client likes. So when a session that can run waits for a
slot, such sessions give theirs up: paused ones first, idle ones once `IDLE_GRACE_S`
has passed since their last token. This is preemption by recompute, as vLLM does it.
The preempted session's history goes back to its pending input and the slot goes idle
with its KV as a prefix cache; when the client reads again the session waits for a slot
like any other and, if the slot still caches its history, continues with no recompute,
else prefills it again. Its sampler already saw that history, so nothing is fed to it
twice. A stream that reads nothing for `reader_timeout_s` ends DEADLINE_EXCEEDED,
naming the flag.

Admission works on sessions (`session.py`); the slot, input and turn it reads or moves are
their main sample's. Sessions with n > 1 (forked samples, reserved slots) are not
preempted. Executor thread only.
"""

from __future__ import annotations

import time
from collections import deque

import structlog

from ..metrics import Metrics
from .allocator import SlotAllocator
from .session import Session
from .slot_kv import SlotKV

log = structlog.get_logger("llmserve.admission")

# A stream idle between turns keeps its slot this long after its last token: a client's
# next turn is usually on its way, and taking the slot then would prefill its history again.
IDLE_GRACE_S = 1.0


def _holds_one_slot(s: Session) -> bool:
    main = s.main
    return main.slot is not None and len(s.samples) == 1 and not s.reserved and main.ready_logits is None


def _last_active(s: Session) -> float:
    return max(s.main.t_last_token, s.main.t_slot)


def _idle(s: Session) -> bool:
    """Between turns with nothing to prefill: the client holds the stream open."""
    return s.main.turn is None and s.samples_open == 0 and not s.later and s.main.num_prefill_ready == 0


class Admission:
    def __init__(
        self, allocator: SlotAllocator, kv: SlotKV, sessions: dict[int, Session], waiting: deque[Session], metrics: Metrics,
    ) -> None:
        self.metrics = metrics
        self.allocator = allocator
        self.kv = kv
        self.sessions = sessions
        self.waiting = waiting
        self.num_preempted = 0
        self.idle_grace_s = IDLE_GRACE_S

    def admit(self, accept_later) -> bool:  # type: ignore[no-untyped-def]
        """Give free slots to waiting sessions that can run: higher priority first, then
        FIFO; paused sessions give up their slots to them. `accept_later(session)` hands a
        restored session the input it received while waiting. True if a session got a slot."""
        admitted = False
        for session in sorted(self.waiting, key=lambda s: (-s.params.priority, s.key)):
            if session.paused or (session.restore is None and not session.main.pending):
                continue  # nothing to run, or nobody reads it
            need = session.params.num_samples
            if self.allocator.num_idle < need and not self._preempt_for(need):
                break
            self.waiting.remove(session)
            if session.restore is not None:
                saved, session.restore = session.restore, None
                slot, loaded = self.kv.restore(saved)
                session.main.resume(slot, saved, loaded)
                accept_later(session)  # a chat rendering now matches against the restored KV
                continue
            if session.preempted_history is not None:
                self._reattach(session)
            else:
                session.main.attach(self.allocator.allocate(session.main.pending), self.allocator.reusable)
                session.reserved = [self.allocator.allocate(()) for _ in range(need - 1)]
            admitted = True
        return admitted

    def _preempt_for(self, need: int) -> bool:
        """Free slots until `need` are idle: those of paused streams (the longest paused
        first), then those of streams idle between turns (the least recently active first)."""
        holders = [s for s in self.sessions.values() if _holds_one_slot(s)]
        paused = sorted((s for s in holders if s.paused), key=lambda s: s.t_paused or 0.0)
        idle_since = time.monotonic() - self.idle_grace_s
        idle = sorted((s for s in holders if not s.paused and _idle(s) and _last_active(s) <= idle_since), key=_last_active)
        victims = paused + idle
        for victim in victims:
            if self.allocator.num_idle >= need:
                break
            self._preempt(victim)
        return self.allocator.num_idle >= need

    def _preempt(self, session: Session) -> None:
        s = session.main
        slot = s.slot
        assert slot is not None
        history = slot.tokens[: slot.num_confirmed]
        sampled = [s.next_token] if s.next_token is not None else []
        # Everything before the old pending input has been through the sampler already.
        s.num_accepted_ahead += len(history) + len(sampled)
        s.pending[:0] = [*history, *sampled]
        s.next_token = None
        s.draft = []
        if s.turn is None or s.turn.t_first_token is None:
            s.turn_cached = 0  # the coming turn's cached tokens: what the slot still holds at reattach
        if slot.shifted:  # positions moved: the cells are no prefix of anything
            self.kv.clear(slot)
            slot.shifted = False
        self.allocator.free(slot)
        s.slot = None
        session.preempted_history = len(history)
        self.waiting.append(session)
        self.num_preempted += 1
        self.metrics.preemptions.labels("paused" if session.paused else "idle").inc()
        log.info("session_preempted", request_id=s.params.request_id, num_tokens=len(history), generating=bool(sampled),
                 reason="its client stopped reading" if session.paused else "idle between turns")

    def _reattach(self, session: Session) -> None:
        """A preempted session gets a slot: reuse what it caches of the history, keep at
        least one token to decode for the logits the turn samples from next."""
        s = session.main
        slot = self.allocator.allocate(s.pending)
        s.slot = slot
        session.preempted_history = None
        matched = slot.match(s.pending[:-1])
        del s.pending[:matched]
        s.num_accepted_ahead = max(0, s.num_accepted_ahead - matched)
        if s.turn is None or s.turn.t_first_token is None:
            s.turn_cached += matched
            if s.turn is not None:
                s.turn.cached_tokens = s.turn_cached
        log.info("session_resumed", request_id=s.params.request_id, num_cached=matched, num_prefill=len(s.pending))

    def expire_readers(self, reader_timeout_s: float | None, fail) -> None:  # type: ignore[no-untyped-def]
        """End streams whose client has read nothing for `reader_timeout_s` (None: never)
        while events waited for it; `fail(session, status, message)` ends one."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if not s.paused:
                s.t_paused = None
            elif s.t_paused is None:
                s.t_paused = now
            elif reader_timeout_s is not None and now - s.t_paused >= reader_timeout_s:
                fail(s, "DEADLINE_EXCEEDED",
                     f"the client read no response for {reader_timeout_s:g} s (--reader-timeout)")

    def idle_timeout(self, deadline_margin_s: float) -> float | None:
        """How long the idle loop may sleep: paused sessions resume when their client
        reads (polled), and deadlines must be caught `deadline_margin_s` before they fall."""
        if any(s.paused for s in self.sessions.values()):
            return 0.005
        if self.waiting:  # an idle stream's slot may become theirs (admission.IDLE_GRACE_S)
            return 0.05
        deadlines = [s.deadline for s in self.sessions.values() if s.deadline is not None]
        if not deadlines:
            return None
        return max(min(deadlines) - time.monotonic() - deadline_margin_s, 0.0)

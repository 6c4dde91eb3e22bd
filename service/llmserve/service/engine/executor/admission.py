"""Who holds a slot: admission of waiting sessions, and preemption of streams nobody reads.

Waiting sessions get free slots by priority, then FIFO. A session whose client stopped
reading (its events pile up: `Session.paused`), or that sits between turns, would keep
its slots for as long as the client likes. So when a session that can run waits for a
slot, such sessions give theirs up: paused ones first, idle ones once `IDLE_GRACE_S`
has passed since their last token. This is preemption by recompute, as vLLM does it.
Each preempted sample's history goes back to its pending input and its slot goes idle
with its KV as a prefix cache; when the client reads again the session waits for its
slots like any other and, where a slot still caches a sample's history, that sample
continues with no recompute, else prefills it again. Its sampler already saw that
history, so nothing is fed to it twice. A stream that reads nothing for
`reader_timeout_s` fails (DEADLINE), naming the flag.

Admission works on sessions (`session.py`); the input and turn it reads are their main
sample's. A session with n > 1 gives up every slot it holds at once, its forked samples'
and its reserved ones too, and gets them all back at once (`num_samples` slots): its
samples share one sink, so they pause together, and a session never runs with only
some of its samples. Recompute rather than ending such a session: ending it would lose
a reply its client may still read, and each sample is one sequence like any other, so
what preempts a lone stream (history back to pending, counted as seen by its sampler)
serves each sample as it is (issue 39: an unread n = 4 stream held all 4 slots for
`--reader-timeout`, or forever with 0). A forked sample prefills its own history again
(its slot may have kept it); a session preempted before its turn forked forks when its
prompt ends, from the reserved slots it gets back. Nobody is preempted when all the
candidates' slots together would not seat the waiting session.

Adapter sets: every distinct (adapter, scale) decodes in steps of its own (step_rotation.py),
so each set with work adds a step to every stream's gap. At most `max_sets` sets other than
the base run at once (`--max-loras-per-batch`, SGLang's flag): a session under a further
set waits until a running set has no session with work left (a stream whose client
stopped reading takes no steps and does not count), and while it waits no
session under an adapter queued behind it is admitted, the running sets' included, so
they drain and it cannot starve; the base's sessions go on being admitted. A session idle
between turns does not count; its next turn may add its set back beyond the bound.
"""

from __future__ import annotations

import time
from collections import deque

import structlog

from ...domain.errors import FailureKind
from ...domain.requests import AdapterSet
from ...metrics import Metrics
from . import alora
from .allocator import SlotAllocator
from .session import Session
from .slot_kv import SlotKV

log = structlog.get_logger("llmserve.admission")

# A stream idle between turns keeps its slot this long after its last token: a client's
# next turn is usually on its way, and taking the slot then would prefill its history again.
IDLE_GRACE_S = 1.0


def _holds_slots(s: Session) -> bool:
    """On its slots (all its samples are, or none) with no saved logits about to be sampled."""
    return s.main.slot is not None and all(x.ready_logits is None for x in s.samples)


def _last_active(s: Session) -> float:
    return max(s.main.t_last_token, s.main.t_slot)


def _idle(s: Session) -> bool:
    """Between turns with nothing to prefill: the client holds the stream open."""
    return s.main.turn is None and s.samples_open == 0 and not s.later and s.main.num_prefill_ready == 0


class Admission:
    def __init__(
        self, allocator: SlotAllocator, kv: SlotKV, sessions: dict[int, Session], waiting: deque[Session], metrics: Metrics,
        max_sets: int,
    ) -> None:
        self.metrics = metrics
        self.max_sets = max_sets
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
        if not self.waiting:  # every step asks: nothing to read then
            return False
        admitted = False
        running = self.running_sets()
        held = False  # a session under a set beyond the bound waits: no adapter session behind it passes it
        for session in sorted(self.waiting, key=lambda s: (-s.params.priority, s.key)):
            if session.paused or (session.restore is None and not session.main.pending):
                continue  # nothing to run, or nobody reads it
            adapters = session.params.adapters
            if adapters and (held or (adapters not in running and len(running) >= self.max_sets)):
                held = True
                continue
            if adapters:
                running.add(adapters)
            need = session.params.num_samples
            if self.allocator.num_idle < need and not self._preempt_for(need):
                break
            self.waiting.remove(session)
            if session.restore is not None:
                saved, session.restore = session.restore, None
                slot, loaded = self.kv.restore(saved, session.params.adapters)
                session.main.resume(slot, saved, loaded)
                accept_later(session)  # a chat rendering now matches against the restored KV
                continue
            if session.preempted_history is not None:
                self._reattach(session)
            else:
                head, kv_adapters = alora.reusable_head(session.main), session.params.kv_adapters  # an aLoRA's: the base's
                slot = self.kv.take(head, session.params.output.reuses_prefix, kv_adapters)
                session.main.attach(slot, self.allocator.reusable)
                session.reserved = [self.allocator.allocate((), kv_adapters) for _ in range(need - 1)]
            admitted = True
        return admitted

    def running_sets(self) -> set[AdapterSet]:
        """The adapter sets (not the base) of sessions on slots that can run: a turn or input to
        run and a client that reads (a paused stream takes no steps, and must not hold a set)."""
        return {s.params.adapters for s in self.sessions.values()
                if s.params.adapters and s.main.slot is not None and not s.paused and not _idle(s)}

    def _preempt_for(self, need: int) -> bool:
        """Free slots until `need` are idle: those of paused streams (the longest paused
        first), then those of streams idle between turns (the least recently active first).
        Nobody gives a slot up when all of theirs together would not be enough."""
        holders = [s for s in self.sessions.values() if _holds_slots(s)]
        paused = sorted((s for s in holders if s.paused), key=lambda s: s.t_paused or 0.0)
        idle_since = time.monotonic() - self.idle_grace_s
        idle = sorted((s for s in holders if not s.paused and _idle(s) and _last_active(s) <= idle_since), key=_last_active)
        victims = paused + idle
        if self.allocator.num_idle + sum(s.num_slots_held for s in victims) < need:
            return False
        for victim in victims:
            if self.allocator.num_idle >= need:
                break
            self._preempt(victim)
        return self.allocator.num_idle >= need

    def _preempt(self, session: Session) -> None:
        """Every sample of `session` gives its slot up, and its reserved slots go too."""
        main = session.main
        assert main.slot is not None
        num_history, generating = main.slot.num_confirmed, main.generating
        for sample in session.samples:
            if sample.slot is not None:
                self.kv.free(sample.give_up_slot())
        for slot in session.reserved:
            self.allocator.free(slot)
        session.reserved.clear()
        session.preempted_history = num_history
        self.waiting.append(session)
        self.num_preempted += 1
        self.metrics.preemptions.labels("paused" if session.paused else "idle").inc()
        log.info("session_preempted", request_id=main.params.request_id, num_tokens=num_history, generating=generating,
                 num_samples=len(session.samples),
                 reason="its client stopped reading" if session.paused else "idle between turns")

    def _reattach(self, session: Session) -> None:
        """A preempted session gets its slots back: each sample one (reusing what it still
        caches of its history), and the session's reserved slots for samples yet to fork."""
        session.preempted_history = None
        adapters = session.params.adapters
        matched = [x.reattach(self.allocator.allocate(x.pending, adapters)) for x in session.samples]
        session.reserved = [self.allocator.allocate((), adapters) for _ in range(session.params.num_samples - len(session.samples))]
        s = session.main
        log.info("session_resumed", request_id=s.params.request_id, num_cached=matched[0], num_prefill=len(s.pending),
                 num_samples=len(session.samples))

    def expire_readers(self, reader_timeout_s: float | None, fail) -> None:  # type: ignore[no-untyped-def]
        """End streams whose client has read nothing for `reader_timeout_s` (None: never)
        while events waited for it; `fail(session, kind, message)` ends one."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if not s.paused:
                s.t_paused = None
            elif s.t_paused is None:
                s.t_paused = now
            elif reader_timeout_s is not None and now - s.t_paused >= reader_timeout_s:
                fail(s, FailureKind.DEADLINE,
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


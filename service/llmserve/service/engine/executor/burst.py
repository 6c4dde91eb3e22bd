"""A burst of requests prefilled together (executor thread).

Requests that arrive together are worth one prefill: each step is a graph run over every
weight, so a prompt prefilled alone and the rest a step later make most of the burst wait
for that first step. The executor starts the moment a prompt is ready, though, and the
event loop takes a few milliseconds per call (parse, validate, tokenize) while the step
competes with it for the CPU. So an executor woken from idle waits while more calls are
arriving: calls the surfaces have begun but not opened (`Arrivals`), and sessions opened
moments ago whose input has not come. A lone request has neither and never waits; the wait
is bounded by a share of a step's time, so a request delays the burst's first prompt by
that much at most.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ...domain.arrivals import Arrivals
from .session import Session

# The longest wait, as a share of the executor's moving average step time: the first
# prompt of a burst gives up at most this much for the others to join its step.
GATHER_SHARE = 0.25


def burst_wait_s(arrivals: Arrivals, sessions: Iterable[Session], t_woken: float, step_s: float) -> float:
    """How long the executor woken at `t_woken` still waits for calls that are arriving (0: go)."""
    now = time.monotonic()
    bound_s = GATHER_SHARE * step_s
    left_s = t_woken + bound_s - now
    if left_s <= 0:
        return 0.0
    awaiting_input = any(s.main.turn is None and not s.later and now - s.t_open < bound_s for s in sessions)
    return left_s if awaiting_input or arrivals.recent(now, bound_s) else 0.0

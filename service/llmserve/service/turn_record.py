"""A finished turn, on either surface: counted in the metrics (the `surface` label is the
session's, `SessionParams.surface`), logged as one `turn_end` line (with the request id
the wing bound) and traced (when on)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from .domain.events import FinishReason, TurnEndEvent
from .domain.requests import SessionParams
from .metrics import Metrics
from .tracing import trace_turn

log = structlog.get_logger("llmserve.generate")


def tokens_per_second(event: TurnEndEvent) -> float:
    """Decode speed: the tokens after the first over the time after the first."""
    decode_s = event.decode_ms / 1000.0
    return (event.completion_tokens - 1) / decode_s if decode_s > 0 and event.completion_tokens > 1 else 0.0


def record_turn(metrics: Metrics, event: TurnEndEvent, params: SessionParams) -> None:
    trace_turn(event, params)
    metrics.observe_turn(event, params.surface)
    log.info(
        "turn_end",
        status="OK" if event.finish_reason != FinishReason.ERROR else "ERROR",
        finish_reason=event.finish_reason.name,
        prompt_tokens=event.prompt_tokens,
        cached_tokens=event.cached_tokens,
        completion_tokens=event.completion_tokens,
        queue_ms=round(event.queue_ms, 1),
        ttft_ms=round(event.ttft_ms, 1),
        tokens_per_s=round(tokens_per_second(event), 1),
        surface=params.surface,
    )


def turn_recorder(metrics: Metrics, params: SessionParams) -> Callable[[object], None]:
    """For `LoopSink.orphans_to`: a session closed with a turn open (the client cancelled the
    call or went away) gets that turn's end from the executor, CANCELLED, after its reader
    left; it is recorded like any other."""
    def record(event: object) -> None:
        if isinstance(event, TurnEndEvent):  # a loop callback: the request's log context is not bound here
            with structlog.contextvars.bound_contextvars(request_id=params.request_id):
                record_turn(metrics, event, params)
    return record

"""A finished turn, counted in the metrics, logged as one line and traced (when on)."""

from __future__ import annotations

import structlog

from ..domain.events import FinishReason, TurnEndEvent
from ..domain.requests import SessionParams
from ..metrics import Metrics
from .responses import tokens_per_second
from .tracing import trace_turn

log = structlog.get_logger("llmserve.generate")


def record_turn(metrics: Metrics, event: TurnEndEvent, params: SessionParams) -> None:
    trace_turn(event, params)
    m = metrics
    m.turns.labels(event.finish_reason.name).inc()
    m.prompt_tokens.inc(event.prompt_tokens)
    m.cached_tokens.inc(event.cached_tokens)
    m.generated_tokens.inc(event.completion_tokens)
    if event.completion_tokens:
        m.ttft.observe(event.ttft_ms / 1000.0)
    m.observe_turn(event)
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
    )

"""OpenTelemetry tracing behind `--otlp-traces-endpoint` (docs/observability.md, Tracing),
shared by both wings.

Off (the default) it costs nothing: no `Tracing` is built, the OpenTelemetry SDK is
never imported, no wing installs its hook (gRPC's interceptor, `transport/tracing.py`;
HTTP's middleware, `http/telemetry.py`), and the two hooks the calls use (`trace_turn`,
`note_embed`) return after one ContextVar read.

On, each wing opens a SERVER span per call, the child of the W3C `traceparent` /
`tracestate` it carries, and hands it to `begin_call`, which binds its `trace_id` into
structlog's contextvars, so every log line of the call carries it. The executor never
calls OpenTelemetry: it stamps monotonic times on `TurnEndEvent` and `EmbedResult`, and
the hooks turn them into spans with explicit start and end times: when a turn ends
(`generate.turn` with `generate.queue`, `generate.prefill` and `generate.decode`), and
when an Embed call ends (`end_embed_batches`: one `embed.batch` per executor step that
held its inputs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from . import __version__
from .domain.events import EmbedResult, FinishReason, TurnEndEvent
from .domain.model_meta import EmbeddingModelInfo, ModelMeta
from .domain.requests import SessionParams

SERVICE_NAME = "llmserve"


class CallTrace:
    """One traced call: its server span, and what its Embed results said about batches."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self.tracer = tracer
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.num_turns = 0
        self.embed_batches: dict[tuple[float, float], list[int]] = {}  # times -> [inputs, tokens, step size]


# Set inside the call's own asyncio task (a gRPC handler's, an aiohttp request's), as the
# request_id structlog binds is: each call has its own copy, gone with the task, so it is
# never reset (a reset token fails when a generator is closed from elsewhere).
_CURRENT: ContextVar[CallTrace | None] = ContextVar("llmserve_call_trace", default=None)


def begin_call(tracer: trace.Tracer, span: trace.Span) -> CallTrace:
    """The call's server span is open: its turns and batches become its children, and its
    log lines carry its trace id. Call it in the call's own task."""
    call = CallTrace(tracer, span)
    _CURRENT.set(call)
    structlog.contextvars.bind_contextvars(trace_id=trace.format_trace_id(span.get_span_context().trace_id))
    return call


class Tracing:
    """The tracer provider and its OTLP/gRPC exporter; spans start once the model is loaded
    (its name is a resource attribute). Built only when tracing is on."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.tracer: trace.Tracer | None = None
        self._provider: Any = None

    def start(self, meta: ModelMeta, embedding: EmbeddingModelInfo | None) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        _forward_sdk_logs()
        resource: dict[str, str] = {
            "service.name": SERVICE_NAME,
            "service.version": __version__,
            "llmserve.model": meta.name,
            "llmserve.model.architecture": meta.architecture,
        }
        if embedding is not None and embedding.separate:
            resource["llmserve.embedding_model"] = embedding.meta.name
        provider = TracerProvider(resource=Resource.create(resource))
        # The batch processor exports from its own thread (OTEL_BSP_* variables tune it).
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint)))
        trace.set_tracer_provider(provider)  # the HTTP wing's tracer (a proxy until now) follows
        self._provider = provider
        self.tracer = provider.get_tracer(SERVICE_NAME, __version__)

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Export what is left, waiting at most `timeout_s` (blocks: call it off the event
        loop). An unreachable collector is retried for up to the exporter's timeout; the
        daemon thread keeps that from holding up the exit."""
        if self._provider is not None:
            flush = threading.Thread(target=self._provider.shutdown, name="llmserve-otel-shutdown", daemon=True)
            flush.start()
            flush.join(timeout_s)


# -------------------------------------------------------------- spans from events


def _to_ns() -> Callable[[float], int]:
    """time.monotonic() seconds -> epoch nanoseconds, as the clocks relate now."""
    offset = time.time_ns() - time.monotonic_ns()
    return lambda t: int(t * 1e9) + offset


def trace_turn(event: TurnEndEvent, params: SessionParams) -> None:
    """A turn ended: its span and its queue, prefill and decode spans (no-op untraced)."""
    call = _CURRENT.get()
    if call is None:
        return
    ns, tracer = _to_ns(), call.tracer
    attributes: dict[str, Any] = {
        "llmserve.turn": call.num_turns,
        "llmserve.sample_index": event.index,
        "gen_ai.usage.input_tokens": event.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": event.cached_tokens,
        "gen_ai.usage.output_tokens": event.completion_tokens,
        "gen_ai.response.finish_reasons": (event.finish_reason.name.lower(),),
        "gen_ai.request.choice.count": params.num_samples,
        "llmserve.request_id": params.request_id,
    }
    if params.session_id:
        attributes["llmserve.session_id"] = params.session_id
    if event.final:
        call.num_turns += 1
    turn = tracer.start_span("generate.turn", call.context, start_time=ns(event.t_queued), attributes=attributes)
    if event.finish_reason == FinishReason.ERROR:
        turn.set_status(Status(StatusCode.ERROR, event.message))
    inside = trace.set_span_in_context(turn)
    phases = (
        ("generate.queue", event.t_queued, event.t_slot, {"llmserve.queue_ms": event.queue_ms}),
        ("generate.prefill", event.t_ready, event.t_first_token, {
            "gen_ai.usage.input_tokens": event.prompt_tokens,
            "gen_ai.usage.cache_read.input_tokens": event.cached_tokens,
        }),
        ("generate.decode", event.t_first_token, event.t_end, {
            "gen_ai.usage.output_tokens": event.completion_tokens,
            "llmserve.draft_tokens": event.draft_tokens,
            "llmserve.accepted_draft_tokens": event.accepted_draft_tokens,
        }),
    )
    for name, start, end, phase_attributes in phases:
        tracer.start_span(name, inside, start_time=ns(start), attributes=phase_attributes).end(end_time=ns(end))
    turn.end(end_time=ns(event.t_end))


def note_embed(result: EmbedResult) -> None:
    """An Embed result arrived: count it in its batch (spans when the call ends)."""
    call = _CURRENT.get()
    if call is None:
        return
    batch = call.embed_batches.setdefault((result.t_batch_start, result.t_batch_end), [0, 0, result.batch_size])
    batch[0] += 1
    batch[1] += result.num_tokens


def end_embed_batches(call: CallTrace) -> None:
    """The call ends: one `embed.batch` span per executor step that held its inputs."""
    ns = _to_ns()
    request_id = structlog.contextvars.get_contextvars().get("request_id", "")
    for (start, end), (num_inputs, num_tokens, step_size) in sorted(call.embed_batches.items()):
        attributes = {
            "llmserve.request_id": request_id,
            "llmserve.batch_inputs": num_inputs,
            "llmserve.step_inputs": step_size,  # this call's and other calls' inputs
            "gen_ai.usage.input_tokens": num_tokens,
        }
        span = call.tracer.start_span("embed.batch", call.context, start_time=ns(start), attributes=attributes)
        span.end(end_time=ns(end))
    call.embed_batches.clear()


# ------------------------------------------------------------------ SDK logs


class _ToStructlog(logging.Handler):
    """The SDK's own warnings (an unreachable collector, dropped spans) as structlog lines."""

    def emit(self, record: logging.LogRecord) -> None:
        structlog.get_logger(record.name).log(record.levelno, "opentelemetry", message=record.getMessage())


def _forward_sdk_logs() -> None:
    sdk_log = logging.getLogger("opentelemetry")
    sdk_log.addHandler(_ToStructlog(logging.WARNING))
    sdk_log.propagate = False

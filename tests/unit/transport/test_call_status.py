"""One status for a finished call: `call_status`, and the three places that count a call
by it (rpc_errors' `llmserve_requests_total`, the per-RPC `grpc_server_handled_total`
and the server span), driven through the real interceptors and wrapper with a fake
context, so that they must agree."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from llmserve.service.domain.errors import InvalidRequest, Overloaded, PreconditionFailed, StorageFault
from llmserve.service.metrics import Metrics
from llmserve.service.transport.errors import InvalidArgument, Unauthenticated, call_status, rpc_errors
from llmserve.service.transport.rpc_metrics import RpcMetricsInterceptor
from llmserve.service.transport.tracing import Tracing, TracingInterceptor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode as SpanStatusCode

_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class FakeContext:
    """What is read of a grpc.aio.ServicerContext, as grpcio 1.85 behaves (checked against a
    real server): code() is None until set; abort_with_status sets it and raises AbortError;
    time_remaining() is None without a deadline and 0 once grpc's deadline has passed."""

    def __init__(self, time_remaining: float | None = None) -> None:
        self._code: grpc.StatusCode | None = None
        self._time_remaining = time_remaining

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def time_remaining(self) -> float | None:
        return self._time_remaining

    async def abort_with_status(self, status: grpc.Status) -> None:
        self._code = status.code
        raise grpc.aio.AbortError()


def _aborted(status: grpc.Status) -> tuple[FakeContext, grpc.aio.AbortError]:
    context = FakeContext(5.0)
    try:
        asyncio.run(context.abort_with_status(status))
    except grpc.aio.AbortError as error:
        return context, error
    raise AssertionError("abort_with_status returned")


# ------------------------------------------------------------------ the rule itself


@pytest.mark.parametrize(
    ("remaining", "error", "expected"),
    [
        (0, asyncio.CancelledError(), "DEADLINE_EXCEEDED"),  # grpc's deadline cancelled the handler
        (2.5, asyncio.CancelledError(), "CANCELLED"),  # the client cancelled or went away
        (None, asyncio.CancelledError(), "CANCELLED"),  # no deadline at all
        (2.5, GeneratorExit(), "CANCELLED"),  # grpc stopped reading the response stream
        (0, GeneratorExit(), "DEADLINE_EXCEEDED"),
        (None, None, "OK"),
        (None, InvalidArgument("bad top_p", field="top_p"), "INVALID_ARGUMENT"),
        (None, Unauthenticated("no key"), "UNAUTHENTICATED"),
        (None, InvalidRequest("too long", field="prompt"), "INVALID_ARGUMENT"),
        (None, PreconditionFailed("no session dir"), "FAILED_PRECONDITION"),
        (None, StorageFault("disk full", path="/x"), "FAILED_PRECONDITION"),
        (None, Overloaded("busy", retry_after_s=1.0), "RESOURCE_EXHAUSTED"),
        (None, KeyError("oops"), "UNKNOWN"),  # what grpc sends for an exception a handler lets out
        (0, InvalidArgument("bad"), "INVALID_ARGUMENT"),  # a refusal is not a deadline
    ],
    ids=["deadline", "client-cancel", "cancel-no-deadline", "stream-closed", "stream-closed-deadline", "ok",
         "service-error", "unauthenticated", "engine-invalid", "engine-precondition", "storage-fault",
         "overloaded", "unexpected", "refusal-at-deadline"],
)
def test_call_status(remaining: float | None, error: BaseException | None, expected: str) -> None:
    assert call_status(FakeContext(remaining), error) == expected


def test_an_abort_reads_its_code_from_the_context() -> None:
    context, error = _aborted(Unauthenticated("no key").to_status())
    assert call_status(context, error) == "UNAUTHENTICATED"
    context, error = _aborted(InvalidArgument("bad").to_status())
    assert call_status(context, error) == "INVALID_ARGUMENT"


def test_a_code_the_handler_set_is_kept() -> None:
    context = FakeContext()
    context.set_code(grpc.StatusCode.NOT_FOUND)
    assert call_status(context, None) == "NOT_FOUND"


# ------------------------------------------------------ the three counts agree


@dataclass(frozen=True)
class _Details:
    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


class _Servicer:
    """Two methods behind rpc_errors; `behave` is what the call does between its responses."""

    def __init__(self, behave: Callable[[Any], Awaitable[None]]) -> None:
        self.metrics = Metrics()
        self.behave = behave

    @rpc_errors
    async def Unary(self, request: object, context: Any) -> str:
        await self.behave(context)
        return "reply"

    @rpc_errors
    async def Stream(self, request: object, context: Any):  # type: ignore[no-untyped-def]
        yield "first"
        await self.behave(context)
        yield "second"


def _raises(error: BaseException) -> Callable[[Any], Awaitable[None]]:
    async def behave(context: Any) -> None:
        raise error

    return behave


async def _returns(context: Any) -> None:
    return None


async def _aborts(context: Any) -> None:
    await context.abort_with_status(Unauthenticated("no key").to_status())


@dataclass(frozen=True)
class Outcome:
    requests: list[str]  # llmserve_requests_total's code labels (rpc_errors)
    handled: list[str]  # grpc_server_handled_total's grpc_code labels (rpc_metrics)
    span: str  # the server span's rpc.grpc.status_code, by name
    span_error: bool


def _labels(counter: Any, label: str) -> list[str]:
    return [s.labels[label] for m in counter.collect() for s in m.samples if s.name.endswith("_total") and s.value]


def _run(behave: Callable[[Any], Awaitable[None]], streaming: bool, remaining: float | None,
         close_after_first: bool = False) -> Outcome:
    """One call through the server's chain: tracing, then rpc_metrics, then rpc_errors."""
    servicer = _Servicer(behave)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing("unused:4317")
    tracing.tracer = provider.get_tracer("test")
    name = "Stream" if streaming else "Unary"
    details = _Details(f"/llmserve.v1.LLMService/{name}")
    make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
    base = make(getattr(servicer, name))

    async def servicer_handler(_: Any) -> grpc.RpcMethodHandler:
        return base

    async def metrics_handler(d: Any) -> grpc.RpcMethodHandler:
        return await RpcMetricsInterceptor(servicer.metrics).intercept_service(servicer_handler, d)

    async def call() -> None:
        handler = await TracingInterceptor(tracing).intercept_service(metrics_handler, details)  # type: ignore[arg-type]
        context = FakeContext(remaining)
        try:
            if not streaming:
                await handler.unary_unary(None, context)
                return
            stream = handler.unary_stream(None, context)
            async for _ in stream:
                if close_after_first:  # as grpc does when it cannot write to a gone client
                    await stream.aclose()
                    break
            for _ in range(10):  # the loop closes the inner generators, each dropped by the one above
                await asyncio.sleep(0)
        except (Exception, asyncio.CancelledError):
            pass

    asyncio.run(call())
    (span,) = exporter.get_finished_spans()
    return Outcome(
        _labels(servicer.metrics.requests, "code"),
        _labels(servicer.metrics.rpc_handled, "grpc_code"),
        _NAMES[span.attributes["rpc.grpc.status_code"]],  # type: ignore[index]
        span.status.status_code == SpanStatusCode.ERROR,
    )


CASES = {
    "ok": (_returns, None, "OK"),
    "deadline cancelled by grpc": (_raises(asyncio.CancelledError()), 0, "DEADLINE_EXCEEDED"),
    "client cancel": (_raises(asyncio.CancelledError()), 30.0, "CANCELLED"),
    "abort": (_aborts, 30.0, "UNAUTHENTICATED"),
    "service error": (_raises(InvalidArgument("bad", field="x")), 30.0, "INVALID_ARGUMENT"),
    "engine refusal": (_raises(Overloaded("busy", retry_after_s=1.0)), 30.0, "RESOURCE_EXHAUSTED"),
    "unexpected exception": (_raises(KeyError("oops")), 30.0, "INTERNAL"),
}


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("case", list(CASES))
def test_metric_label_and_trace_status_agree(case: str, streaming: bool) -> None:
    behave, remaining, expected = CASES[case]
    outcome = _run(behave, streaming, remaining)
    assert outcome.requests == [expected]
    assert outcome.handled == [expected]
    assert outcome.span == expected
    assert outcome.span_error == (expected in {"DEADLINE_EXCEEDED", "INTERNAL"})


@pytest.mark.parametrize(("remaining", "expected"), [(30.0, "CANCELLED"), (0, "DEADLINE_EXCEEDED")])
def test_a_closed_response_stream_agrees(remaining: float, expected: str) -> None:
    """grpc stops reading (GeneratorExit at the yield): the client went away, or its deadline."""
    outcome = _run(_returns, True, remaining, close_after_first=True)
    assert outcome.requests == [expected]
    assert outcome.handled == [expected]
    assert outcome.span == expected


def test_an_exception_from_a_handler_without_rpc_errors_is_unknown_in_both() -> None:
    """Health and reflection are not wrapped: grpc sends UNKNOWN for what they let out."""
    metrics, exporter = Metrics(), InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing("unused:4317")
    tracing.tracer = provider.get_tracer("test")

    async def raw(request: object, context: Any) -> None:
        raise KeyError("oops")

    async def inner(_: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(raw)

    async def through_metrics(d: Any) -> grpc.RpcMethodHandler:
        return await RpcMetricsInterceptor(metrics).intercept_service(inner, d)

    async def call() -> None:
        details = _Details("/llmserve.v1.LLMService/Raw")
        handler = await TracingInterceptor(tracing).intercept_service(through_metrics, details)  # type: ignore[arg-type]
        with pytest.raises(KeyError):
            await handler.unary_unary(None, FakeContext())

    asyncio.run(call())
    (span,) = exporter.get_finished_spans()
    assert _labels(metrics.rpc_handled, "grpc_code") == ["UNKNOWN"]
    assert _NAMES[span.attributes["rpc.grpc.status_code"]] == "UNKNOWN"  # type: ignore[index]

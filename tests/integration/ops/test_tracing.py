"""OpenTelemetry tracing against the real server: an OTLP/gRPC collector in this test
process (opentelemetry-proto's TraceService) receives what `--otlp-traces-endpoint`
exports; with the flag off, nothing reaches it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from llmserve.client import Client
from opentelemetry.proto.trace.v1 import trace_pb2

from harness.server import RunningServer, server_log_lines, start_server, stop_server
from tests.integration.ops.otlp_collector import PARENT_ID, TRACE_ID, TRACEPARENT, Collector, Span, start_collector

ARGS = ["-np", "2", "-c", "4096", "-t", "2", "--embeddings"]
CLOCK_SLACK_NS = 5_000_000  # spans from monotonic stamps vs. the SDK's wall clock
API_KEY = "tracing-test-key"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Collector]]:
    collector, grpc_server, port = start_collector()
    folder = tmp_path_factory.mktemp("traced")
    log_path = folder / "server.log"
    # A short batch delay (the SDK reads OTEL_BSP_SCHEDULE_DELAY) so that spans come at once.
    flags = ["--otlp-traces-endpoint", f"http://127.0.0.1:{port}", "--api-key", API_KEY, "--session-dir", str(folder)]
    running = start_server([*ARGS, *flags], log_path, env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    yield running, collector
    assert stop_server(running) == 0
    grpc_server.stop(0)


def _by_name(spans: list[Span], name: str) -> list[Span]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start)


def test_generate_and_embed_spans_join_the_callers_trace(traced) -> None:  # type: ignore[no-untyped-def]
    server, collector = traced
    with Client(server.address, timeout=60, api_key=API_KEY) as client:
        generate = client.with_metadata(("traceparent", TRACEPARENT), ("x-request-id", "traced-generate"))
        with generate.session(max_tokens=4, temperature=0, ignore_eos=True, session_id="traced-session") as session:
            session.ask("The capital of France is")
            second = session.ask(" and the capital of Italy is")
        assert second.turn_end.usage.cached_tokens > 0
        embed = client.with_metadata(("traceparent", TRACEPARENT), ("x-request-id", "traced-embed"))
        assert len(list(embed.embed(["first document", "second document", "third"]))) == 3

    names = {"llmserve.v1.LLMService/Generate", "llmserve.v1.LLMService/Embed", "embed.batch"}
    spans = collector.wait_for(names | {"generate.turn", "generate.queue", "generate.prefill", "generate.decode"})
    assert {s.trace_id for s in spans} == {TRACE_ID}
    assert all(s.resource["service.name"] == "llmserve" and s.resource["llmserve.model"] for s in spans)

    (rpc,) = _by_name(spans, "llmserve.v1.LLMService/Generate")
    assert rpc.parent_id == PARENT_ID and rpc.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert rpc.attributes["rpc.method"] == "Generate" and rpc.attributes["rpc.grpc.status_code"] == 0
    assert rpc.attributes["llmserve.request_id"] == "traced-generate"

    turns = _by_name(spans, "generate.turn")
    assert [t.attributes["llmserve.turn"] for t in turns] == [0, 1]
    for turn in turns:
        assert turn.parent_id == rpc.span_id
        assert turn.attributes["llmserve.request_id"] == "traced-generate"
        assert turn.attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert turn.attributes["gen_ai.usage.output_tokens"] == 4
        assert turn.attributes["gen_ai.request.choice.count"] == 1
        assert turn.attributes["llmserve.session_id"] == "traced-session"
        children = {s.name: s for s in spans if s.parent_id == turn.span_id}
        assert set(children) == {"generate.queue", "generate.prefill", "generate.decode"}
        queue, prefill, decode = children["generate.queue"], children["generate.prefill"], children["generate.decode"]
        times = [turn.start, queue.start, queue.end, prefill.start, prefill.end, decode.start, decode.end, turn.end]
        assert times == sorted(times), times
        assert rpc.start - CLOCK_SLACK_NS <= turn.start and turn.end <= rpc.end + CLOCK_SLACK_NS
        assert prefill.attributes["gen_ai.usage.input_tokens"] > 0
        assert decode.attributes["gen_ai.usage.output_tokens"] == 4 and decode.end > decode.start
    first, second_turn = turns
    assert first.end <= second_turn.start + CLOCK_SLACK_NS
    assert second_turn.attributes["gen_ai.usage.cache_read.input_tokens"] > 0

    (embed_rpc,) = _by_name(spans, "llmserve.v1.LLMService/Embed")
    assert embed_rpc.parent_id == PARENT_ID and embed_rpc.attributes["llmserve.request_id"] == "traced-embed"
    batches = _by_name(spans, "embed.batch")
    assert all(b.parent_id == embed_rpc.span_id and b.start <= b.end for b in batches)
    assert sum(b.attributes["llmserve.batch_inputs"] for b in batches) == 3
    assert all(b.attributes["gen_ai.usage.input_tokens"] > 0 for b in batches)

    lines = server_log_lines(server.log_path)
    mine = [line for line in lines if line.get("request_id") == "traced-generate"]
    assert [line["event"] for line in mine].count("turn_end") == 2
    assert all(line.get("trace_id") == TRACE_ID for line in mine), mine
    listening = next(line for line in lines if line["event"] == "listening")
    assert listening["tracing"].startswith("http://127.0.0.1:")


def _wait_for_span(collector: Collector, name: str) -> Span:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = [s for s in collector.spans if s.name == name]
        if found:
            (span,) = found
            return span
        time.sleep(0.1)
    raise AssertionError(f"no {name} span")


def test_a_call_without_traceparent_starts_its_own_trace(traced) -> None:  # type: ignore[no-untyped-def]
    server, collector = traced
    with Client(server.address, timeout=60, api_key=API_KEY) as client:
        client.tokenize("hello")
    span = _wait_for_span(collector, "llmserve.v1.LLMService/Tokenize")
    assert span.parent_id == "" and span.trace_id != TRACE_ID and span.attributes["rpc.grpc.status_code"] == 0


def test_a_call_the_api_key_refuses_is_traced(traced) -> None:  # type: ignore[no-untyped-def]
    server, collector = traced
    with Client(server.address, timeout=60, api_key="wrong") as client, pytest.raises(Exception, match="API key"):
        client.model_info()
    span = _wait_for_span(collector, "llmserve.v1.LLMService/GetModelInfo")
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]


def test_off_by_default_exports_nothing(tmp_path: Path) -> None:
    """No flag: the standard OTEL_* exporter variables pointing at a live collector change
    nothing, log lines carry no trace_id, and the server says tracing is off."""
    collector, grpc_server, port = start_collector()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"LLMSERVE_OTLP_TRACES_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    running = start_server(ARGS, tmp_path / "server.log", env=env)
    try:
        with Client(running.address, timeout=60) as client:
            calls = client.with_metadata(("traceparent", TRACEPARENT), ("x-request-id", "not-traced"))
            calls.generate("Hello", max_tokens=2)
            list(calls.embed(["a document"]))
        time.sleep(1.0)  # ten schedule delays
    finally:
        assert stop_server(running) == 0
        grpc_server.stop(0)
    assert collector.num_exports == 0 and collector.spans == []
    lines = server_log_lines(running.log_path)
    assert next(line for line in lines if line["event"] == "listening")["tracing"] == "off"
    mine = [line for line in lines if line.get("request_id") == "not-traced"]
    assert mine and not any("trace_id" in line for line in mine)


def test_the_server_stack_imports_no_sdk_until_tracing_starts() -> None:
    """The SDK and the exporter are imported by `Tracing.start` only; until then the
    global tracer provider is OpenTelemetry's no-op proxy."""
    code = (
        "import sys\n"
        "from llmserve.service import process\n"
        "from llmserve.service.transport import server, tracing\n"
        "from opentelemetry import trace\n"
        "assert not [m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))]\n"
        "assert type(trace.get_tracer_provider()).__name__ == 'ProxyTracerProvider'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

"""The HTTP wing under observation, against the real server: Prometheus series scraped
from --metrics-port, spans received by an OTLP collector in this process, JSON log lines,
and the `x-request-timeout` header ending a turn as a gRPC deadline does."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from harness.metrics import scrape
from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, server_log_lines, start_server, stop_server
from tests.integration.ops.otlp_collector import PARENT_ID, TRACE_ID, TRACEPARENT, Collector, start_collector

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Collector]]:
    collector, collector_server, port = start_collector()
    args = [*CHAT_SERVER_ARGS, "--otlp-traces-endpoint", f"http://127.0.0.1:{port}"]
    log_path = tmp_path_factory.mktemp("http-observed") / "server.log"
    running = start_server(args, log_path, metrics=True, http_port=free_port(), env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    yield running, collector
    assert stop_server(running) == 0
    collector_server.stop(0)


@pytest.fixture(scope="module")
def client(observed: tuple[RunningServer, Collector]) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{observed[0].http_port}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def test_requests_are_counted_by_route_method_and_status(observed, client: OpenAI, model: str) -> None:  # type: ignore[no-untyped-def]
    server, _ = observed
    before = scrape(server.metrics_port)
    client.chat.completions.create(model=model, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=HELLO, max_tokens=2, extra_body={"nonsense": 1})  # type: ignore[arg-type]
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v1/no/such/route?x=1", timeout=10)
    assert missing.value.code == 404
    after = scrape(server.metrics_port)

    def moved(name: str, **labels: str) -> float:
        return after.counted(name, **labels) - before.counted(name, **labels)

    assert moved("llmserve_http_requests_total", route=CHAT, method="POST", status="200") == 1
    assert moved("llmserve_http_requests_total", route=CHAT, method="POST", status="400") == 1
    assert moved("llmserve_http_requests_total", route="other", method="GET", status="404") == 1
    assert moved("llmserve_http_request_duration_seconds_count", route=CHAT) == 2
    assert moved("llmserve_http_request_duration_seconds_sum", route=CHAT) > 0
    assert not any(name == "llmserve_http_requests_total" and ("route", "/v1/no/such/route") in labels
                   for name, labels in after.samples)


def test_an_http_turn_lands_in_the_histograms_with_surface_http(observed, client: OpenAI, model: str) -> None:  # type: ignore[no-untyped-def]
    server, _ = observed
    before = scrape(server.metrics_port)
    reply = client.chat.completions.with_raw_response.create(
        model=model, messages=HELLO, max_tokens=6, temperature=0, extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        extra_headers={"x-request-id": "observed-http-turn"},
    )
    completion = reply.parse()
    assert completion.usage is not None and completion.usage.completion_tokens == 6
    after = scrape(server.metrics_port)

    def moved(name: str, surface: str) -> float:
        return after.counted(name, surface=surface) - before.counted(name, surface=surface)

    assert moved("llmserve_time_to_first_token_seconds_count", "http") == 1
    assert moved("llmserve_inter_token_latency_seconds_count", "http") == 5
    assert moved("llmserve_queue_time_seconds_count", "http") == 1
    assert moved("llmserve_turn_generated_tokens_count", "http") == 1
    assert moved("llmserve_turn_generated_tokens_sum", "http") == 6
    for name in ("llmserve_time_to_first_token_seconds_count", "llmserve_inter_token_latency_seconds_count"):
        assert moved(name, "grpc") == 0
    assert 0 < after.counted("llmserve_kv_cells_used_ratio") <= 1
    deadline = time.monotonic() + 5
    while after.counted("llmserve_running_sessions") and time.monotonic() < deadline:  # the close is on its way
        time.sleep(0.05)
        after = scrape(server.metrics_port)
    assert after.counted("llmserve_running_sessions") == 0 and after.counted("llmserve_waiting_sessions") == 0

    time.sleep(0.2)
    mine = [line for line in server_log_lines(server.log_path) if line.get("request_id") == "observed-http-turn"]
    (turn_end,) = [line for line in mine if line["event"] == "turn_end"]
    assert turn_end["surface"] == "http" and turn_end["completion_tokens"] == 6


def test_a_traceparent_parents_the_request_span_and_its_turn(observed, client: OpenAI, model: str) -> None:  # type: ignore[no-untyped-def]
    server, collector = observed
    client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=3, extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        extra_headers={"traceparent": TRACEPARENT, "x-request-id": "traced-http-chat"},
    )
    spans = collector.wait_for({f"POST {CHAT}", "generate.turn", "generate.queue", "generate.prefill",
                                "generate.decode"})
    (request,) = [s for s in spans if s.name == f"POST {CHAT}"]
    assert request.parent_id == PARENT_ID and request.kind == 2  # SPAN_KIND_SERVER
    assert request.attributes["http.route"] == CHAT and request.attributes["http.response.status_code"] == 200
    assert request.attributes["llmserve.request_id"] == "traced-http-chat"
    (turn,) = [s for s in spans if s.name == "generate.turn"]
    assert turn.parent_id == request.span_id and turn.attributes["gen_ai.usage.output_tokens"] == 3
    children = {s.name for s in spans if s.parent_id == turn.span_id}
    assert children == {"generate.queue", "generate.prefill", "generate.decode"}

    mine = [line for line in server_log_lines(server.log_path) if line.get("request_id") == "traced-http-chat"]
    assert mine and all(line.get("trace_id") == TRACE_ID for line in mine), mine


def test_the_health_probe_is_counted_not_traced(observed) -> None:  # type: ignore[no-untyped-def]
    server, collector = observed
    before = scrape(server.metrics_port)
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/health", headers={"traceparent": TRACEPARENT})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    after = scrape(server.metrics_port)
    labels = {"route": "/health", "method": "GET", "status": "200"}
    assert after.counted("llmserve_http_requests_total", **labels) == before.counted("llmserve_http_requests_total", **labels) + 1
    time.sleep(0.5)  # five schedule delays
    assert not [s for s in collector.spans if s.name == "GET /health"]


def test_x_request_timeout_ends_a_long_turn_like_a_deadline(observed, client: OpenAI, model: str) -> None:  # type: ignore[no-untyped-def]
    """1500 tokens take minutes on this CPU; the header's 3 s end the turn with DEADLINE,
    which OpenAI's shape calls "length" (cut by a limit). The prompt is cached by the
    earlier tests, so the turn has begun well before its deadline (a deadline that passes
    before the turn begins is a 408, as gRPC's is DEADLINE_EXCEEDED without a turn end)."""
    server, _ = observed
    timeout_s = 3.0
    started = time.monotonic()
    completion = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=1500, extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        extra_headers={"x-request-timeout": str(timeout_s), "x-request-id": "timed-out-chat"},
    )
    elapsed = time.monotonic() - started
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens < 1500
    assert 1.0 < elapsed < timeout_s + 3.0, elapsed  # it ends a step early rather than late
    time.sleep(0.2)
    mine = [line for line in server_log_lines(server.log_path) if line.get("request_id") == "timed-out-chat"]
    assert [line["finish_reason"] for line in mine if line["event"] == "turn_end"] == ["DEADLINE"]

    started = time.monotonic()
    stream = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=1500, stream=True, extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        extra_headers={"x-request-timeout": str(timeout_s)},
    )
    finishes = [choice.finish_reason for chunk in stream for choice in chunk.choices if choice.finish_reason]
    assert finishes == ["length"] and time.monotonic() - started < timeout_s + 3.0


def test_x_request_timeout_must_be_a_positive_number(observed, client: OpenAI, model: str) -> None:  # type: ignore[no-untyped-def]
    for value in ("soon", "0", "-1", "nan", "inf"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=HELLO, max_tokens=2,  # type: ignore[arg-type]
                                           extra_headers={"x-request-timeout": value})
        assert refused.value.param == "x-request-timeout"
        assert "x-request-timeout" in refused.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="Hello", max_tokens=2, extra_headers={"x-request-timeout": "0"})

"""Logs (structlog JSON with request ids) and Prometheus metrics, scraped for real."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import Scrape, scrape
from harness.server import free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parents[3]
IDLE_GAUGES = ("llmserve_waiting_sessions", "llmserve_running_sessions", "llmserve_sessions")


def test_every_log_line_is_json_and_calls_carry_the_request_id(server) -> None:  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(config=session_config(max_tokens=3), input=make_input("Hello"), end_of_turn=True)
    with grpc.insecure_channel(server.address) as channel:
        responses = list(
            pb_grpc.LLMServiceStub(channel).Generate(
                iter([request]), metadata=(("x-request-id", "rid-from-metadata-42"),), timeout=30
            )
        )
    assert all(r.request_id == "rid-from-metadata-42" for r in responses)
    _goaway_with_error(server.address)  # gRPC's core logs that at INFO unless told not to
    time.sleep(0.2)
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.strip()]
    mine = [line for line in lines if line.get("request_id") == "rid-from-metadata-42"]
    summary = next(line for line in mine if line["event"] == "turn_end")
    for field in ("finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens", "queue_ms", "ttft_ms", "tokens_per_s"):
        assert field in summary
    assert summary["completion_tokens"] == 3 and summary["rpc"] == "Generate"
    events = {line["event"] for line in lines}
    assert {"model_loaded", "n_batch_clamped_for_embeddings", "serving"} <= events
    assert any(line["event"] == "llama_cpp" for line in lines)  # llama.cpp's log, as JSON


def _goaway_with_error(address: str) -> None:
    """An HTTP/2 client that says GOAWAY with error code 8 (CANCEL), as some clients do."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        sock.sendall(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + (0).to_bytes(4, "big") + (8).to_bytes(4, "big"))
        time.sleep(0.3)


def _idle_scrape(port: int) -> Scrape:
    """/metrics once the session gauges show the calls ended (the executor publishes its
    snapshot after its steps, so they may lag the reply a little), or after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        page = scrape(port)
        if all(page.metric(name) == 0 for name in IDLE_GAUGES) or time.monotonic() > deadline:
            return page
        time.sleep(0.1)


def test_metrics_endpoint(server) -> None:  # type: ignore[no-untyped-def]
    before = scrape(server.metrics_port)
    with Client(server.address, timeout=30) as client:
        usage = client.generate("Count: one, two,", max_tokens=8, temperature=0, ignore_eos=True).turn_end.usage
        list(client.embed(["a", "b", "c"]))
    after = _idle_scrape(server.metrics_port)
    ok = 'llmserve_requests_total{code="OK",rpc="Generate"}'
    assert after.metric(ok) >= before.counted(ok) + 1
    assert after.metric("llmserve_generated_tokens_total") >= 8
    assert after.metric("llmserve_embeddings_total") >= 3
    assert after.metric('llmserve_time_to_first_token_seconds_count{surface="grpc"}') >= 1
    assert after.metric('llmserve_inter_token_latency_seconds_count{surface="grpc"}') >= 7
    assert after.metric('llmserve_step_duration_seconds_count{kind="generate"}') >= 8
    assert after.metric('llmserve_batch_tokens_count{kind="embed"}') >= 1
    assert after.metric('llmserve_slots{state="idle"}') + after.metric('llmserve_slots{state="busy"}') == 8
    for name in IDLE_GAUGES:
        assert after.metric(name) == 0, name  # both calls ended: nothing open, waiting or running
    for name, turn in (("llmserve_prompt_tokens_total", usage.prompt_tokens),
                       ("llmserve_cached_tokens_total", usage.cached_tokens)):
        was = before.metric(name)
        assert after.metric(name) >= was + turn, (name, was, turn)  # the turn's usage was counted
    assert after.metric("llmserve_cached_tokens_total") <= after.metric("llmserve_prompt_tokens_total")
    assert 0 < after.metric("llmserve_kv_cells_used_ratio") <= 1


def test_dashboard_metrics_are_exported(server) -> None:  # type: ignore[no-untyped-def]
    """The series issue 18 asks for: request histograms, model info, process and per-RPC."""
    with Client(server.address, timeout=30) as client:
        client.generate("Count: one, two,", max_tokens=5, temperature=0, ignore_eos=True)
        client.model_info()
    page = scrape(server.metrics_port)
    for histogram in ("llmserve_queue_time_seconds", "llmserve_turn_duration_seconds",
                      "llmserve_turn_prompt_tokens", "llmserve_turn_generated_tokens"):
        assert page.metric(f'{histogram}_count{{surface="grpc"}}') >= 1, histogram
    assert page.metric('llmserve_turn_generated_tokens_bucket{le="4.0",surface="grpc"}') < page.metric(
        'llmserve_turn_generated_tokens_bucket{le="16.0",surface="grpc"}')
    info = next(line for line in page.text.splitlines() if line.startswith("llmserve_model_info{"))
    assert 'quantization="Q4_K_M"' in info and 'architecture="gemma3"' in info and info.endswith(" 1.0")
    assert page.metric("process_resident_memory_bytes") > 100e6
    assert page.metric("process_cpu_seconds_total") > 0
    bidi = 'grpc_method="Generate",grpc_service="llmserve.v1.LLMService",grpc_type="bidi_stream"'
    assert page.metric(f'grpc_server_handled_total{{grpc_code="OK",{bidi}}}') >= 1
    assert page.metric(f"grpc_server_started_total{{{bidi}}}") >= 1
    assert page.metric(f"grpc_server_handling_seconds_count{{{bidi}}}") >= 1
    unary = 'grpc_method="GetModelInfo",grpc_service="llmserve.v1.LLMService",grpc_type="unary"'
    assert page.metric(f'grpc_server_handled_total{{grpc_code="OK",{unary}}}') >= 1


def test_log_format_console_or_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """JSON when stdout is not a TTY (auto), console lines with --log-format console."""
    junk = tmp_path / "junk.gguf"  # loads far enough to log, then fails
    junk.write_text("not a model")
    outputs = {}
    for fmt in ("auto", "console", "json"):
        done = subprocess.run(
            [sys.executable, "-m", "llmserve.service", "serve", "--model", str(junk), "--log-format", fmt, "--port", "0"],
            capture_output=True, text=True, timeout=120,
        )
        outputs[fmt] = [line for line in done.stdout.splitlines() if line.strip()]
        assert outputs[fmt], done.stderr
    for fmt in ("auto", "json"):
        assert all(json.loads(line)["event"] for line in outputs[fmt])
    for line in outputs["console"]:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    assert any("listening" in line for line in outputs["console"])


def test_dashboard_queries_use_only_exported_metrics(tmp_path: Path) -> None:
    """Every metric name in deploy/grafana's dashboard is one the server really exports,
    after a gRPC call and an HTTP one (the HTTP panels read the HTTP API's series)."""
    server = start_server(["-np", "1", "-c", "1024", "-t", "2"], tmp_path / "server.log", metrics=True,
                          http_port=free_port())
    try:
        with Client(server.address, timeout=30) as client:
            client.generate("Hi", max_tokens=2)
        body = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/completions", body,
                                         {"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(request, timeout=60).read())["usage"]["completion_tokens"] == 2
        exported = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in scrape(server.metrics_port).text.splitlines()
                    if line and not line.startswith("#")}
    finally:
        assert stop_server(server) == 0
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "llmserve.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = set()
    for expr in exprs:
        # drop label matchers, ranges, strings, `by (labels)` and numbers such as 1e-9
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\bby \([^)]*\)|\b\d[\d.]*(e-?\d+)?", " ", expr)
        names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)) - PROMQL_WORDS
        assert names, expr
        used |= names
    missing = sorted(used - exported)
    assert not missing, f"dashboard uses metrics the server does not export: {missing}"
    assert len(used) >= 12


PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "clamp_min", "without", "avg", "max", "min", "irate"}

"""Logs (structlog JSON with request ids) and Prometheus metrics, scraped for real."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc


def test_every_log_line_is_json_and_calls_carry_the_request_id(server) -> None:  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(config=session_config(max_tokens=3), input=make_input("Hello"), end_of_turn=True)
    with grpc.insecure_channel(server.address) as channel:
        responses = list(
            pb_grpc.LLMServiceStub(channel).Generate(
                iter([request]), metadata=(("x-request-id", "rid-from-metadata-42"),), timeout=30
            )
        )
    assert all(r.request_id == "rid-from-metadata-42" for r in responses)
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


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not exported")


def test_metrics_endpoint(server) -> None:  # type: ignore[no-untyped-def]
    before = _scrape(server.metrics_port)
    with Client(server.address, timeout=30) as client:
        client.generate("Count: one, two,", max_tokens=8, temperature=0, ignore_eos=True)
        list(client.embed(["a", "b", "c"]))
    after = _scrape(server.metrics_port)
    ok = 'llmserve_requests_total{code="OK",rpc="Generate"}'
    assert _value(after, ok) >= (_value(before, ok) if ok in before else 0) + 1
    assert _value(after, "llmserve_generated_tokens_total") >= 8
    assert _value(after, "llmserve_embeddings_total") >= 3
    assert _value(after, "llmserve_time_to_first_token_seconds_count") >= 1
    assert _value(after, "llmserve_inter_token_latency_seconds_count") >= 7
    assert _value(after, 'llmserve_step_duration_seconds_count{kind="generate"}') >= 8
    assert _value(after, 'llmserve_batch_tokens_count{kind="embed"}') >= 1
    assert _value(after, 'llmserve_slots{state="idle"}') + _value(after, 'llmserve_slots{state="busy"}') == 8
    for name in ("llmserve_waiting_sessions", "llmserve_kv_cells_used_ratio", "llmserve_prompt_tokens_total",
                 "llmserve_cached_tokens_total", "llmserve_sessions"):
        assert _value(after, name) >= 0
    assert 0 < _value(after, "llmserve_kv_cells_used_ratio") <= 1

"""Standard services: health (Check and Watch) and reflection driven by `buf curl`."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.metrics import total
from tests.helpers import buf_curl


def test_health_check_and_watch(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "llmserve.v1.LLMService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_buf_curl_lists_and_calls_through_reflection(server) -> None:  # type: ignore[no-untyped-def]
    base = f"http://{server.address}"
    methods = buf_curl("--list-methods", base).split()
    for name in ("Generate", "Embed", "Tokenize", "Detokenize", "GetModelInfo"):
        assert f"llmserve.v1.LLMService/{name}" in methods
    info = json.loads(buf_curl(f"{base}/llmserve.v1.LLMService/GetModelInfo"))
    assert info["architecture"] == "gemma3"
    request = {
        "config": {"sampling": {"temperature": 0}, "stopping": {"maxTokens": 4}},
        "input": {"text": "Hello"},
        "endOfTurn": True,
    }
    out = buf_curl("-d", json.dumps(request), f"{base}/llmserve.v1.LLMService/Generate")
    messages = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00")]
    assert messages[-1]["turnEnd"]["finishReason"] == "FINISH_REASON_LENGTH"
    assert messages[-1]["turnEnd"]["usage"]["completionTokens"] == 4
    assert "".join(m["chunk"]["text"] for m in messages[:-1] if "chunk" in m)


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
def test_reflection_v1_and_v1alpha(server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    service = f"grpc.reflection.{protocol.removeprefix('grpc-')}.ServerReflection"
    before = _reflection_calls(server.metrics_port, service)
    methods = buf_curl("--reflect-protocol", protocol, "--list-methods", f"http://{server.address}").split()
    assert "llmserve.v1.LLMService/Generate" in methods
    services = {m.rsplit("/", 1)[0] for m in methods}
    assert {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= services
    assert _reflection_calls(server.metrics_port, service) > before  # that protocol answered


def _reflection_calls(metrics_port: int, service: str) -> float:
    return total(metrics_port, "grpc_server_started_total", grpc_service=service)

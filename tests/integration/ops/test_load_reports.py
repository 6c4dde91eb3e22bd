"""ORCA load reports against the real server and model (issue 28): the out-of-band
stream Envoy and gRPC clients read, the per-call `endpoint-load-metrics-bin` trailer,
and the same load in Prometheus."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from llmserve.client import Client
from llmserve.service.load_report import MIN_RPS, MIN_UTILIZATION
from llmserve.v1 import llmserve_pb2 as pb
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport
from xds.service.orca.v3 import orca_pb2, orca_pb2_grpc

from harness.metrics import metric
from harness.server import RunningServer
from tests.fixtures import module_server

API_KEY = "load-report-key"
NAMED = {"kv_cache_usage", "running_sessions", "waiting_sessions", "prefill_tokens_waiting", "slot_wait_s"}


orca_server = module_server(
    ["-np", "2", "-c", "4096", "-t", "2", "--max-queue", "2", "--api-key", API_KEY], "orca", http=True, metrics=True,
    doc="""Two slots, so that a third call waits, and 2 waiting at most (utilization is over
    the 4 sessions admitted); an API key, which load reports do not need.""")


def _stream(channel: grpc.Channel, interval_s: float) -> Iterator[tuple[float, OrcaLoadReport]]:
    request = orca_pb2.OrcaLoadReportRequest(report_interval=Duration(nanos=int(interval_s * 1e9)))
    for report in orca_pb2_grpc.OpenRcaServiceStub(channel).StreamCoreMetrics(request, timeout=120):
        yield time.monotonic(), report


def test_each_http_reply_carries_the_load_report_in_its_headers(orca_server: RunningServer) -> None:
    """The OpenAI HTTP surface: Envoy's HTTP cluster weights replicas by the
    `endpoint-load-metrics-bin` header of each reply (base64, as on gRPC); its calls count
    toward the same call rate. Listing models is no call. (First in the module: before it
    the replica has served no call, and reports both floors, 0 reading as "no weight".)"""
    before = _report(orca_server.address)
    assert (before.application_utilization, before.rps_fractional) == (MIN_UTILIZATION, pytest.approx(MIN_RPS))
    for _ in range(3):
        headers = _http_post(orca_server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    report = OrcaLoadReport.FromString(base64.b64decode(headers["endpoint-load-metrics-bin"]))
    assert set(report.named_metrics) == NAMED
    assert report.application_utilization >= MIN_UTILIZATION
    assert report.rps_fractional > 2 * MIN_RPS  # 3 calls in the window
    request = urllib.request.Request(f"http://127.0.0.1:{orca_server.http_port}/v1/models",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert "endpoint-load-metrics-bin" not in response.headers


def _report(address: str) -> OrcaLoadReport:
    with grpc.insecure_channel(address) as channel:
        return next(_stream(channel, 1.0))[1]


def _http_post(server: RunningServer, path: str, body: dict[str, object]) -> dict[str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return dict(response.headers)


def test_out_of_band_reports_follow_the_load(orca_server: RunningServer) -> None:
    """Idle: no session. Two long generations and a long prompt waiting for a slot:
    utilization counts the sessions of the 4 admitted plus the queued prefill and the wait
    for a slot, and the named metrics say why. Reports come no faster than the server's floor (0.5 s) however
    often the client asks, and the stream needs no API key."""
    client = Client(orca_server.address, api_key=API_KEY, timeout=120)
    long_prompt = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(80))
    calls: list[threading.Thread] = []

    def generate(prompt: str, max_tokens: int) -> None:
        client.generate(prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True)

    busy: OrcaLoadReport | None = None
    prometheus = 0.0
    with grpc.insecure_channel(orca_server.address) as channel:
        reports = _stream(channel, 0.1)
        t0, idle = next(reports)
        t1, _ = next(reports)
        assert t1 - t0 >= 0.4, "reports faster than the server's floor"
        assert set(idle.named_metrics) == NAMED and idle.named_metrics["running_sessions"] == 0
        for prompt, max_tokens in (("Count slowly:", 400), ("Name many animals:", 400), (long_prompt, 1)):
            calls.append(threading.Thread(target=generate, args=(prompt, max_tokens)))
            calls[-1].start()
            time.sleep(0.5)  # in this order: the long prompt is the one that waits
        for _, report in reports:
            if report.named_metrics["waiting_sessions"] >= 1:
                busy = report
                prometheus = metric(orca_server.metrics_port, "llmserve_load_utilization")
                break
    for call in calls:
        call.join()
    client.close()
    assert busy is not None
    named = busy.named_metrics
    assert named["running_sessions"] == 2 and named["waiting_sessions"] == 1, dict(named)
    assert named["prefill_tokens_waiting"] >= 800, dict(named)  # the waiting prompt's tokens
    assert 0 < named["kv_cache_usage"] < 1
    # A new call would wait for the waiting prompt, then for a slot: the second of the two
    # 400-token replies to end, each step at least 5 ms on this model.
    assert named["slot_wait_s"] >= 1.0, dict(named)
    # 3 sessions of the 4 admitted, plus (queued prefill + slot wait) x 2 slots
    assert busy.application_utilization >= (3 + 2 * named["slot_wait_s"]) / 4
    assert prometheus > 0.75


def _trailers_on_the_wire(address: str, method: str, request: bytes) -> dict[str, str]:
    """A call's HTTP/2 trailers as sent (gRPC's own clients consume
    `endpoint-load-metrics-bin` for their load balancing and never show it)."""
    curl = shutil.which("curl")
    assert curl, "curl (with HTTP/2) reads the trailers on the wire"
    framed = struct.pack(">BI", 0, len(request)) + request
    run = subprocess.run(
        [curl, "-sv", "--http2-prior-knowledge", "-H", "content-type: application/grpc", "-H", "te: trailers",
         "-H", f"authorization: Bearer {API_KEY}", "--data-binary", "@-", "-o", "/dev/null",
         f"http://{address}/llmserve.v1.LLMService/{method}"],
        input=framed, capture_output=True, timeout=60, check=True,
    )
    lines = [line[2:] for line in run.stderr.decode().splitlines() if line.startswith("< ")]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def test_each_call_ends_with_a_load_report_in_its_trailers(orca_server: RunningServer) -> None:
    """What gRPC's weighted_round_robin and Envoy read without out-of-band reports: the
    `endpoint-load-metrics-bin` trailer, with the call rate."""
    for _ in range(3):
        _trailers_on_the_wire(orca_server.address, "Tokenize", pb.TokenizeRequest(text="hello").SerializeToString())
    request = pb.GenerateTextRequest(config=pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=4)),
                                     input=pb.Input(text="Hi"))
    trailers = _trailers_on_the_wire(orca_server.address, "GenerateText", request.SerializeToString())
    assert trailers["grpc-status"] == "0", trailers
    report = OrcaLoadReport.FromString(base64.b64decode(trailers["endpoint-load-metrics-bin"] + "=="))
    assert set(report.named_metrics) == NAMED
    assert report.rps_fractional > MIN_RPS  # 4 calls in the last seconds
    assert report.named_metrics["running_sessions"] <= 1  # the last step published may still hold the call itself


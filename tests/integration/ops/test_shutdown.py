"""Graceful shutdown of a real process on SIGTERM: the drain, and the lame duck
(`--drain-delay`) that serves new calls while load balancers learn it is not ready."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmserve.client import SERVICE_CONFIG, Client, Unavailable, pb

from harness.metrics import counted
from harness.server import RunningServer, start_server
from tests.helpers import SessionStream

GRACE_S = 15.0  # the short turn must finish inside it even on a slow, fresh server
SHORT_TOKENS = 24  # 48 tokens in 8 s failed on a busy 2-core machine (3-5 tokens/s with 3 streams)


def _run_turn(stream: SessionStream) -> tuple[pb.TurnEnd | None, grpc.StatusCode]:
    try:
        _, _, end = stream.read_turn()
        stream.close()
        list(stream.call)
        return end, stream.call.code()
    except grpc.RpcError as err:
        return None, err.code()


def _finish_one_shot(stream) -> tuple[pb.TurnEnd | None, grpc.StatusCode]:  # type: ignore[no-untyped-def]
    try:
        responses = list(stream)
        return responses[-1].turn_end, grpc.StatusCode.OK
    except grpc.RpcError as err:
        return None, err.code()


def test_sigterm_drains_then_exits_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # No drafts: a greedy 2,000-token loop drafted ran at 216 tokens/s and ended inside the grace
    server = start_server(
        ["-np", "3", "-c", "6144", "-t", "2", "--shutdown-grace", str(GRACE_S), "--spec-type", "none"],
        tmp_path / "server.log",
    )
    channel = grpc.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=60)  # readiness
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    # A one-shot call (input, end of turn, half-close): its turn must complete, status OK.
    short = Client(server.address, timeout=60).stream("Say something short:", max_tokens=SHORT_TOKENS, temperature=0,
                                                      ignore_eos=True)
    long = SessionStream(channel, max_tokens=2000, temperature=0, ignore_eos=True)
    idle = SessionStream(channel, max_tokens=4, temperature=0)
    long.send("Say something very long:")
    idle.send("An idle multi-turn session.")
    assert idle.read_turn()[2].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert next(short).HasField("chunk") and long.next_response().HasField("chunk")

    with ThreadPoolExecutor(3) as pool:
        short_done = pool.submit(_finish_one_shot, short)
        long_done = pool.submit(_run_turn, long)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING  # not ready: draining
        liveness = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert liveness.status == health_pb2.HealthCheckResponse.SERVING  # but alive: no restart
        # retries=False: the server's own answer, not the SDK's retry policy
        with pytest.raises(grpc.RpcError) as refused, Client(server.address, timeout=5, retries=False) as client:
            client.generate("too late", max_tokens=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as idle_end:
            idle.next_response()
        assert idle_end.value.code() == grpc.StatusCode.UNAVAILABLE  # no open turn: ends at once
        short_end, short_code = short_done.result(timeout=30)
        long_end, long_code = long_done.result(timeout=30)
    exit_code = server.process.wait(timeout=30)
    elapsed = time.monotonic() - signalled
    channel.close()
    assert short_code == grpc.StatusCode.OK and short_end is not None
    assert short_end.usage.completion_tokens == SHORT_TOKENS  # the in-flight turn finished
    assert long_code == grpc.StatusCode.UNAVAILABLE  # still running after the grace period
    assert exit_code == 0
    assert GRACE_S <= elapsed < GRACE_S + 10
    log = server.log_path.read_text()
    assert '"event": "draining"' in log and '"event": "stopped"' in log


ATTEMPTS = SERVICE_CONFIG["methodConfig"][0]["retryPolicy"]["maxAttempts"]
DRAIN_DELAY_S = 5.0  # the call made right after the SIGTERM starts well inside it


def _refused(server: RunningServer) -> float:
    """Generate calls the server has answered UNAVAILABLE (its Prometheus counter)."""
    return counted(server.metrics_port, 'llmserve_requests_total{code="UNAVAILABLE",rpc="Generate"}')


def _wait_for_log(server: RunningServer, event: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while f'"event": "{event}"' not in server.log_path.read_text():
        assert time.monotonic() < deadline, f"no {event} in the log within {timeout} s"
        time.sleep(0.05)
    return time.monotonic()


def test_the_lame_duck_serves_then_refusals_are_trailers_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM with --drain-delay: readiness NOT_SERVING at once, new calls still served for
    the delay; then refused UNAVAILABLE before any response headers (trailers-only), which
    is what lets a retry policy try the call again: the SDK's policy makes all its attempts
    (gRPC commits a call to its first attempt once response headers arrive)."""
    server = start_server(["-np", "2", "-c", "8192", "-t", "2", "--shutdown-grace", "30",
                           "--drain-delay", str(DRAIN_DELAY_S)], tmp_path / "server.log", metrics=True)
    channel = grpc.insecure_channel(server.address)
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=120)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    # Keeps the drain open past the delay and the refused call: 1000 greedy tokens, which loop
    # and draft, were done within ~9.5 s of SIGTERM on a fast machine, and the server stopped.
    holder = SessionStream(channel, max_tokens=4000, temperature=0, ignore_eos=True)
    holder.send("Write a very long story:")
    assert holder.next_response().HasField("chunk")

    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    with Client(server.address, timeout=30, retries=False) as client:  # the server's own answer
        during = client.generate("Served by a lame duck:", max_tokens=2)
    served_at = time.monotonic()
    refusing_at = _wait_for_log(server, "refusing_new_calls", timeout=DRAIN_DELAY_S + 10)
    before = _refused(server)
    with Client(server.address, timeout=30) as client, pytest.raises(Unavailable) as refused:
        client.generate("Too late:", max_tokens=2)
    deadline = time.monotonic() + 3  # the server counts a call just after answering it
    while (attempts := _refused(server) - before) < ATTEMPTS and time.monotonic() < deadline:
        time.sleep(0.02)
    holder.call.cancel()
    code = server.process.wait(timeout=30)
    channel.close()
    print(f"served {served_at - signalled:.2f} s after SIGTERM; refusing from {refusing_at - signalled:.2f} s; "
          f"one SDK call made {attempts:g} attempts")
    assert during.turn_end.usage.completion_tokens == 2  # not ready, and still serving (no retries)
    assert refusing_at - signalled >= DRAIN_DELAY_S
    assert refused.value.details() == "the server is shutting down"
    assert attempts == ATTEMPTS  # every attempt of the policy: the refusal was trailers-only
    assert code == 0

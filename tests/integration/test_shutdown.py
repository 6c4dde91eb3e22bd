"""Graceful shutdown of a real process on SIGTERM."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmserve.client import Client, pb

from tests.conftest import start_server
from tests.helpers import SessionStream

GRACE_S = 8.0  # the 48-token turn must finish inside it even on a slow, fresh server


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
    server = start_server(
        ["-np", "3", "-c", "6144", "-t", "2", "--shutdown-grace", str(GRACE_S)], tmp_path / "server.log"
    )
    channel = grpc.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=60)  # readiness
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    # A one-shot call (input, end of turn, half-close): its turn must complete, status OK.
    short = Client(server.address, timeout=60).stream("Say something short:", max_tokens=48, temperature=0, ignore_eos=True)
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
    assert short_end.usage.completion_tokens == 48  # the in-flight turn finished
    assert long_code == grpc.StatusCode.UNAVAILABLE  # still running after the grace period
    assert exit_code == 0
    assert GRACE_S <= elapsed < GRACE_S + 10
    log = server.log_path.read_text()
    assert '"event": "draining"' in log and '"event": "stopped"' in log

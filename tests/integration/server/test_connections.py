"""Connection management: max connection age (GOAWAY, then a grace period for calls in
flight) lets balancers rebalance long-lived channels, and keepalive enforcement turns
away clients that ping too often while keeping those that follow the published rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from llmserve.client import pb

from harness.server import RunningServer, start_server, stop_server
from tests.helpers import SessionStream


@pytest.fixture(scope="module")
def aging_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        ["-np", "2", "-c", "2048", "-t", "2", "--max-connection-age", "1", "--max-connection-age-grace", "60",
         "--keepalive-min-time", "10"],
        tmp_path_factory.mktemp("conn") / "server.log",
    )
    yield running
    assert stop_server(running) == 0


def test_an_old_connection_is_asked_to_go_away_but_its_calls_finish(aging_server: RunningServer) -> None:
    states: list[grpc.ChannelConnectivity] = []
    lock = threading.Lock()

    def record(state: grpc.ChannelConnectivity) -> None:
        with lock:
            states.append(state)

    with grpc.insecure_channel(aging_server.address) as channel:
        channel.subscribe(record)
        stream = SessionStream(channel, max_tokens=48, temperature=0, ignore_eos=True)
        started = time.monotonic()
        stream.send("Tell a long story:")
        stream.read_turn()
        time.sleep(1.2)  # the call stays open past the 1 s age, however fast the first turn was
        stream.send(" Go on:")
        _, _, end = stream.read_turn()  # the grace period covers the call in flight
        took = time.monotonic() - started
        stream.close()
        time.sleep(1.5)
        second = SessionStream(channel, max_tokens=2)  # the channel reconnects on its own
        second.send("Hi")
        _, _, again = second.read_turn()
        second.close()
        channel.unsubscribe(record)
    assert took > 1.0, "the call must outlive the connection's age for this test"
    assert end.finish_reason == pb.FINISH_REASON_LENGTH and end.usage.completion_tokens == 48
    assert again.usage.completion_tokens == 2
    ready_to_idle = any(a == grpc.ChannelConnectivity.READY and b == grpc.ChannelConnectivity.IDLE
                        for a, b in zip(states, states[1:]))
    assert ready_to_idle, states  # GOAWAY: the channel went idle and reconnected


def _idle_session_survives(address: str, keepalive_ms: int) -> bool:
    options = [("grpc.keepalive_time_ms", keepalive_ms), ("grpc.keepalive_timeout_ms", 5000),
               ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
    with grpc.insecure_channel(address, options=options) as channel:
        stream = SessionStream(channel, max_tokens=2)
        stream.send("Hi")
        stream.read_turn()
        time.sleep(4)  # an idle session between turns: no data, only pings
        try:
            stream.send("Again")
            stream.read_turn()
            return True
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
        finally:
            stream.close()


def test_keepalive_enforcement(aging_server: RunningServer) -> None:
    assert not _idle_session_survives(aging_server.address, keepalive_ms=200)  # too_many_pings: GOAWAY
    assert _idle_session_survives(aging_server.address, keepalive_ms=30_000)  # the SDK's rate

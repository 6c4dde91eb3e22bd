"""The published service config in effect on the SDK's channels, against real servers:
RESOURCE_EXHAUSTED from a full queue is tried again (the server counts every attempt),
a refused call succeeds once the slot frees, and a call waits for a server that is not
listening yet (wait-for-ready)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from llmserve.client import SERVICE_CONFIG, Client, ResourceExhausted, Unavailable

from harness.metrics import counted
from harness.server import RunningServer, free_port, start_server, stop_server
from tests.helpers import SessionStream

LONG = dict(max_tokens=2000, temperature=0, ignore_eos=True)
ATTEMPTS = SERVICE_CONFIG["methodConfig"][0]["retryPolicy"]["maxAttempts"]


@pytest.fixture(scope="module")
def full_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One slot and no waiting room: a second session is refused at once."""
    running = start_server(["-np", "1", "-c", "2048", "-t", "2", "--max-queue", "0"],
                           tmp_path_factory.mktemp("retries") / "server.log", metrics=True)
    yield running
    assert stop_server(running) == 0


def _refused(server: RunningServer) -> int:
    """Generate calls the server has answered RESOURCE_EXHAUSTED (its Prometheus counter)."""
    return int(counted(server.metrics_port, "llmserve_requests_total", rpc="Generate", code="RESOURCE_EXHAUSTED"))


def _refused_reaches(server: RunningServer, count: int) -> int:
    """The counter once it reaches `count` (the server counts just after answering), or after 3 s."""
    deadline = time.monotonic() + 3
    while (seen := _refused(server)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return seen


def _hold_the_slot(channel: grpc.Channel) -> SessionStream:
    holder = SessionStream(channel, **LONG)
    holder.send("Talk for a long time:")
    holder.next_response()
    return holder


def test_a_full_queue_is_tried_again_by_the_sdk(full_server: RunningServer) -> None:
    with grpc.insecure_channel(full_server.address) as channel:
        holder = _hold_the_slot(channel)
        try:
            before = _refused(full_server)
            with Client(full_server.address, timeout=120, retries=False) as plain, pytest.raises(ResourceExhausted):
                plain.generate("One too many", max_tokens=2)
            once = _refused_reaches(full_server, before + 1)
            with Client(full_server.address, timeout=120) as client, pytest.raises(ResourceExhausted) as err:
                client.generate("One too many", max_tokens=2)
            retried = _refused_reaches(full_server, once + ATTEMPTS)
        finally:
            holder.call.cancel()
    assert once - before == 1  # retries off: one attempt
    assert retried - once == ATTEMPTS  # the policy's every attempt reached the server
    assert err.value.retry_after_s is not None and err.value.retry_after_s > 0  # RetryInfo, read with rpc_status


def test_a_refused_call_succeeds_once_the_slot_frees(full_server: RunningServer) -> None:
    with grpc.insecure_channel(full_server.address) as channel, ThreadPoolExecutor(1) as pool, \
            Client(full_server.address, timeout=120) as client:
        holder = _hold_the_slot(channel)
        before = _refused(full_server)
        call = pool.submit(client.generate, "Now there is room:", max_tokens=2)
        try:
            assert _refused_reaches(full_server, before + 1) > before, "the first attempt was not refused"
        finally:
            holder.call.cancel()  # the slot frees while the SDK backs off
        result = call.result(timeout=60)
    assert result.turn_end.usage.completion_tokens == 2


class _Forwarder:
    """A TCP port that starts listening only when asked, and pipes to a real server."""

    def __init__(self, port: int, target: str) -> None:
        host, _, target_port = target.rpartition(":")
        self.target = (host, int(target_port))
        self.listener = socket.create_server(("127.0.0.1", port))
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def test_a_call_waits_for_a_server_that_is_not_listening_yet(server: RunningServer) -> None:
    port = free_port()
    with Client(f"127.0.0.1:{port}", timeout=5, retries=False, wait_for_ready=False) as eager:
        with pytest.raises(Unavailable):  # without wait-for-ready: refused at once
            eager.model_info()
    with Client(f"127.0.0.1:{port}", timeout=60) as client, ThreadPoolExecutor(1) as pool:
        call = pool.submit(client.generate, "Hello", max_tokens=2, temperature=0)
        time.sleep(1.5)
        assert not call.done(), "the call did not wait for the server"
        forwarder = _Forwarder(port, server.address)
        try:
            result = call.result(timeout=45)
        finally:
            forwarder.close()
    assert result.turn_end.usage.completion_tokens == 2

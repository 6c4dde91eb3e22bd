"""Admission control: a bounded waiting queue, priorities among waiters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import Client

from harness.server import RunningServer, start_server, stop_server
from tests.helpers import SessionStream

LONG = dict(max_tokens=2000, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        ["-np", "1", "-c", "4096", "-t", "2", "--max-queue", "2"], tmp_path_factory.mktemp("admission") / "server.log"
    )
    yield running
    assert stop_server(running) == 0


def _keep_reading(holder: SessionStream) -> threading.Thread:
    """The holder's client reads its reply: a stream nobody reads would give its slot up
    to the waiters (engine/executor/admission.py), and the slot must stay busy here."""

    def read() -> None:
        try:
            while True:
                holder.next_response()
        except (grpc.RpcError, StopIteration):
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait_waiting(client: Client, n: int) -> None:
    deadline = time.monotonic() + 5
    while client.model_info().num_sessions_waiting != n:
        assert time.monotonic() < deadline, "sessions did not queue"
        time.sleep(0.01)


def test_queue_full_is_resource_exhausted_fast_with_retry_info(one_slot_server: RunningServer) -> None:
    # retries=False: this measures the server's answer, not the SDK's retry policy (test_sdk_retries.py)
    with grpc.insecure_channel(one_slot_server.address) as channel, \
            Client(one_slot_server.address, timeout=10, retries=False) as client:
        holder = SessionStream(channel, **LONG)
        holder.send("Talk for a long time:")
        holder.next_response()
        _keep_reading(holder)
        waiters = [SessionStream(channel, max_tokens=2, temperature=0) for _ in range(2)]
        for w in waiters:
            w.send("Hi")
        _wait_waiting(client, 2)
        start = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            client.generate("One too many", max_tokens=2)
        elapsed_ms = (time.perf_counter() - start) * 1000
        holder.call.cancel()
        for w in waiters:
            w.read_turn()
            w.close()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    print(f"RESOURCE_EXHAUSTED after {elapsed_ms:.1f} ms")
    assert elapsed_ms < 50  # the server decides at once; the round trip is the rest
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    retry = error_details_pb2.RetryInfo()
    assert status is not None and any(d.Unpack(retry) for d in status.details)
    assert retry.retry_delay.ToMilliseconds() > 0
    # The same delay as the trailer gRPC retry policies honour (gRFC A6).
    pushback = dict(err.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert pushback["grpc-retry-pushback-ms"] == str(retry.retry_delay.ToMilliseconds())


def _admission_order(address: str, priorities: list[int]) -> list[int]:
    """Queue sessions (in list order) behind a busy slot; return the order they get it.

    One slot: a waiter's turn can only end once it holds the slot, and the next waiter
    gets it only when that one closes. So the order the turns end is the admission order
    (read from threads, without timing windows)."""
    with grpc.insecure_channel(address) as channel, Client(address, timeout=10) as client:
        holder = SessionStream(channel, **LONG)
        holder.send("Talk for a long time:")
        holder.next_response()
        _keep_reading(holder)
        waiters = []
        for i, priority in enumerate(priorities):
            w = SessionStream(channel, max_tokens=2, temperature=0, priority=priority)
            w.send(f"waiter {i}")
            _wait_waiting(client, i + 1)
            waiters.append(w)
        order: list[int] = []
        lock = threading.Lock()

        def serve(i: int, waiter: SessionStream) -> None:
            waiter.read_turn()
            with lock:
                order.append(i)
            waiter.close()

        threads = [threading.Thread(target=serve, args=(i, w)) for i, w in enumerate(waiters)]
        for thread in threads:
            thread.start()
        holder.call.cancel()
        for thread in threads:
            thread.join(60)
        return order


def test_higher_priority_waiter_is_admitted_first(one_slot_server: RunningServer) -> None:
    assert _admission_order(one_slot_server.address, [0, 5]) == [1, 0]


def test_equal_priority_is_fifo(one_slot_server: RunningServer) -> None:
    assert _admission_order(one_slot_server.address, [0, 0]) == [0, 1]

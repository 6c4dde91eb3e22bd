"""Cancellation: in-band cancel keeps the session; a cancelled or dropped call frees its slot."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc
import pytest
from llmserve.client import Client, pb

from tests.helpers import SessionStream, busy_slots

LONG = dict(max_tokens=1000, temperature=0, ignore_eos=True)


def _wait_all_free(client: Client, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if busy_slots(client) == 0 and client.model_info().num_sessions_waiting == 0:
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError("slots still busy")


def test_in_band_cancel_ends_the_turn_and_the_session_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        session = SessionStream(channel, **LONG)
        session.send("Count from one to a thousand: one, two,")
        for _ in range(3):
            assert session.next_response().HasField("chunk")
        session.cancel()
        _, ids, end = session.read_turn()
        assert end.finish_reason == pb.FINISH_REASON_CANCELLED
        assert end.usage.completion_tokens < 1000
        session.send(" Now say hi.", end_of_turn=True)
        # The second turn runs on the same stream (cancel it too, quickly).
        assert session.next_response().HasField("chunk")
        session.cancel()
        _, _, end2 = session.read_turn()
        assert end2.finish_reason == pb.FINISH_REASON_CANCELLED
        assert end2.usage.cached_tokens > 0
        session.close()
        assert list(session.call) == []  # the stream then closes OK
        assert session.call.code() == grpc.StatusCode.OK


def test_cancelling_the_call_frees_the_slot(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=10) as client:
        session = SessionStream(channel, **LONG)
        session.send("Write a very long story:")
        session.next_response()
        assert busy_slots(client) >= 1
        session.call.cancel()
        waited = _wait_all_free(client)
        print(f"slot free {waited * 1000:.0f} ms after cancel")


def test_dropped_connection_frees_the_slot(server) -> None:  # type: ignore[no-untyped-def]
    script = (
        "import os, sys, grpc\n"
        "from llmserve.client import Client\n"
        "client = Client(sys.argv[1])\n"
        "stream = client.stream('Tell me everything about the sea:', max_tokens=1000, ignore_eos=True)\n"
        "next(stream)\n"
        "os._exit(0)  # vanish without closing anything\n"
    )
    subprocess.run([sys.executable, "-c", script, server.address], check=True, timeout=60)
    with Client(server.address, timeout=10) as client:
        _wait_all_free(client)
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2


def test_deadline_ends_the_turn_and_frees_the_slot(server) -> None:  # type: ignore[no-untyped-def]
    responses: list[pb.GenerateResponse] = []
    with Client(server.address, timeout=0.5) as client:
        with pytest.raises(grpc.RpcError) as err:
            for response in client.stream("Write a very long story:", **LONG):
                responses.append(response)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server ends the turn just before the deadline, while the stream is writable.
    assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_DEADLINE
    assert 0 < responses[-1].turn_end.usage.completion_tokens < 1000
    with Client(server.address, timeout=10) as client:
        _wait_all_free(client)


def test_deadline_while_waiting_for_a_slot(server) -> None:  # type: ignore[no-untyped-def]
    """All slots busy: a queued call with a short deadline ends DEADLINE_EXCEEDED in time."""
    with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=10) as client:
        n = client.model_info().n_parallel
        holders = [SessionStream(channel, **LONG) for _ in range(n)]
        for h in holders:
            h.send("Keep talking about anything at all:")
        for h in holders:
            h.next_response()
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err, Client(server.address, timeout=0.4) as short:
            short.generate("Hello", max_tokens=4)
        elapsed = time.monotonic() - start
        for h in holders:
            h.call.cancel()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert elapsed < 1.0
        _wait_all_free(client)

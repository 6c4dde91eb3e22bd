"""Named sessions on a --session-dir shared by two servers (replicas on one volume): only
one server holds a session at a time, and the next one continues from its saved state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from llmserve.client import Client

from harness.server import RunningServer, start_server, stop_server


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, RunningServer]]:
    directory = tmp_path_factory.mktemp("shared")
    args = ["-np", "2", "-c", "2048", "-t", "1", "--session-dir", str(directory / "sessions")]
    a = start_server(args, directory / "a.log")
    b = start_server(args, directory / "b.log")
    yield a, b
    assert stop_server(a) == 0 and stop_server(b) == 0


def test_one_server_at_a_time_then_the_other_continues(pair: tuple[RunningServer, RunningServer]) -> None:
    a, b = pair
    with Client(a.address, timeout=60) as on_a, Client(b.address, timeout=60) as on_b:
        with on_a.session(session_id="tenant-7", max_tokens=4, temperature=0) as session:
            first = session.ask("My name is Ada. Remember it.")
            with pytest.raises(grpc.RpcError) as refused:  # A holds it: B must not use a stale state
                on_b.generate("What is my name?", session_id="tenant-7", max_tokens=4)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "another server" in (refused.value.details() or "")
        deadline = time.monotonic() + 30
        while True:  # A's save settles right after its stream ends; B retries as told
            try:
                second = on_b.generate(" What is my name?", session_id="tenant-7", max_tokens=4, temperature=0)
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and time.monotonic() < deadline
                time.sleep(0.2)
    history = first.turn_end.usage.prompt_tokens + first.turn_end.usage.completion_tokens
    assert second.turn_end.usage.cached_tokens >= history - 1  # B went on from A's saved state
    assert list(Path(a.log_path.parent / "sessions" / "locks").glob("*.lock"))

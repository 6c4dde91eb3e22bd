"""Named sessions survive the stream and a server restart (KV state saved to --session-dir)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from llmserve.client import Client

from harness.metrics import counted
from harness.server import RunningServer, start_server, stop_server
from tests.greedy import parting
from tests.helpers import SessionStream

ARGS = ["-np", "2", "-c", "4096", "-t", "2"]
TURN1 = "Question: Which planet is known as the red planet?\nAnswer:"
TURN2 = "\nQuestion: And which one has the great red spot?\nAnswer:"
TURN3 = "\nQuestion: Which planet is closest to the sun?\nAnswer:"
GREEDY = dict(max_tokens=10, temperature=0, ignore_eos=True, top_logprobs=4)


def _start(directory: Path, log: Path, extra: list[str] | None = None) -> RunningServer:
    return start_server([*ARGS, "--session-dir", str(directory), *(extra or [])], log, metrics=True)


def test_session_survives_a_restart(tmp_path: Path, fresh_server: RunningServer) -> None:
    """Turn 3 after a restart continues from the saved KV: it is what a cold server computes
    for the whole transcript as one prompt. That cold run is on another server (here the
    transcript would be served from turn 3's own KV and saved logits, the same digits even
    if the restored KV were wrong), in another KV layout and batch shape, so the replies
    are compared by logprobs (tests/greedy.py), within twice the largest difference
    measured here (AVX2: 0.136 nats over the 10 tokens)."""
    sessions = tmp_path / "sessions"
    server = _start(sessions, tmp_path / "a.log")
    try:
        with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=60) as client:
            p1 = client.tokenize(TURN1)
            p2 = client.tokenize(TURN2, add_special=False)
            p3 = client.tokenize(TURN3, add_special=False)
            s = SessionStream(channel, session_id="conversation-1", **GREEDY)
            s.send(p1)
            _, g1, _ = s.read_turn()
            s.send(p2)
            _, g2, _ = s.read_turn()
            s.close()
            assert list(s.call) == []
    finally:
        assert stop_server(server) == 0
    files = list(sessions.glob("*.session"))
    assert len(files) == 1

    server = _start(sessions, tmp_path / "b.log")  # a new process
    try:
        with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=60) as client:
            s = SessionStream(channel, session_id="conversation-1", **GREEDY)
            s.send(p3)  # only the new input
            _, g3, end3 = s.read_turn()
            turn3 = s.turn_logprobs
            s.close()
            hits = counted(server.metrics_port, 'llmserve_session_cache_total{result="hit"}')
    finally:
        assert stop_server(server) == 0
    with Client(fresh_server.address, timeout=60) as client:
        cold = client.generate(p1 + g1 + p2 + g2 + p3, **GREEDY)  # type: ignore[arg-type]
    in_kv = len(p1) + len(g1) + len(p2) + len(g2) - 1  # the last sampled token enters with turn 3
    assert end3.usage.cached_tokens == in_kv
    assert end3.usage.prompt_tokens == len(p3)
    assert cold.turn_end.usage.cached_tokens == 0
    assert len(turn3) == len(g3) == len(cold.logprobs) == GREEDY["max_tokens"]
    print(f"restored session: {in_kv} tokens cached after restart; turn 3 vs the whole transcript on a cold "
          f"server: parted at {parting(cold.logprobs, turn3, 0.3)}")
    assert hits == 1


def test_corrupt_and_incompatible_files_are_discarded(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    server = _start(sessions, tmp_path / "a.log")
    try:
        with grpc.insecure_channel(server.address) as channel:
            for name in ("to-corrupt", "to-keep"):
                s = SessionStream(channel, session_id=name, **GREEDY)
                s.send("Some history worth keeping.")
                s.read_turn()
                s.close()
                list(s.call)
        assert stop_server(server) == 0
        files = sorted(sessions.glob("*.session"), key=lambda p: p.stat().st_mtime)
        assert len(files) == 2
        blob = bytearray(files[0].read_bytes())
        blob[-100] ^= 0xFF  # flip a byte of the saved state
        files[0].write_bytes(bytes(blob))

        server = _start(sessions, tmp_path / "b.log", ["-ctk", "q8_0", "-ctv", "q8_0"])  # another KV layout
        with grpc.insecure_channel(server.address) as channel:
            ends = {}
            for name in ("to-corrupt", "to-keep"):
                s = SessionStream(channel, session_id=name, **GREEDY)
                s.send("New input.")
                ends[name] = s.read_turn()[2]
                s.close()
                list(s.call)
    finally:
        stop_server(server)
    # Both refused: each started afresh (at most its own new input can come from the prefix cache).
    assert all(end.usage.cached_tokens <= end.usage.prompt_tokens for end in ends.values()), ends
    log = server.log_path.read_text()
    assert "checksum mismatch" in log and "another model or KV layout" in log


def test_one_stream_per_session_id_and_session_dir_required(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        s = SessionStream(channel, session_id="x", **GREEDY)
        s.send("hi")
        with pytest.raises(grpc.RpcError) as err:
            s.read_turn()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # the main server has no --session-dir
    running = _start(tmp_path / "s", tmp_path / "c.log")
    try:
        with grpc.insecure_channel(running.address) as channel:
            first = SessionStream(channel, session_id="busy", max_tokens=400, ignore_eos=True)
            first.send("Talk for a while:")
            first.next_response()
            second = SessionStream(channel, session_id="busy", **GREEDY)
            second.send("me too")
            with pytest.raises(grpc.RpcError) as err:
                second.read_turn()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            first.call.cancel()
    finally:
        stop_server(running)

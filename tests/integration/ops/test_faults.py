"""Faults with real processes: SIGKILL mid-stream, restart; SIGTERM under load."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import start_server, stop_server

ARGS = ["-np", "4", "-c", "4096", "-t", "2", "--shutdown-grace", "2"]


def _long_stream(address: str, started: list[float]) -> tuple[str, float]:
    """Stream a long generation; returns (final status, seconds from the first chunk to the end)."""
    request = pb.GenerateRequest(
        config=session_config(max_tokens=900, ignore_eos=True), input=make_input("Write forever:"), end_of_turn=True
    )
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=120)
        first = None
        try:
            for _ in call:
                if first is None:
                    first = time.monotonic()
                    started.append(first)
            return "OK", time.monotonic() - (first or time.monotonic())
        except grpc.RpcError as err:
            return err.code().name, time.monotonic() - (first or time.monotonic())


def test_sigkill_mid_stream_then_restart(tmp_path: Path) -> None:
    server = start_server(ARGS, tmp_path / "a.log")
    started: list[float] = []
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_long_stream, server.address, started) for _ in range(3)]
        while len(started) < 3:
            time.sleep(0.02)
        killed_at = time.monotonic()
        server.process.send_signal(signal.SIGKILL)
        results = [f.result(timeout=30) for f in futures]
    ended_within = [time.monotonic() - killed_at]
    server.process.wait(10)
    assert [status for status, _ in results] == ["UNAVAILABLE"] * 3
    print(f"after SIGKILL the streams ended UNAVAILABLE within {ended_within[0]:.2f} s")
    assert ended_within[0] < 5
    restarted = start_server(ARGS, tmp_path / "b.log")
    try:
        with Client(restarted.address, timeout=30) as client:
            assert client.generate("Hello again", max_tokens=3).turn_end.usage.completion_tokens == 3
    finally:
        assert stop_server(restarted) == 0


def test_sigterm_under_load_ends_every_call(tmp_path: Path) -> None:
    server = start_server(ARGS, tmp_path / "c.log")
    started: list[float] = []

    def short(i: int) -> str:
        try:
            # Without the SDK's retries and wait-for-ready: what the server answers each call.
            with Client(server.address, timeout=60, retries=False, wait_for_ready=False) as client:
                client.generate(f"Short request {i}:", max_tokens=8)
            return "OK"
        except grpc.RpcError as err:
            return err.code().name  # type: ignore[no-any-return]

    with ThreadPoolExecutor(12) as pool:
        longs = [pool.submit(_long_stream, server.address, started) for _ in range(4)]
        shorts = [pool.submit(short, i) for i in range(8)]  # queued behind the long ones
        while len(started) < 4:
            time.sleep(0.02)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        statuses = [f.result(timeout=60)[0] for f in longs] + [f.result(timeout=60) for f in shorts]
    code = server.process.wait(30)
    elapsed = time.monotonic() - signalled
    print(f"SIGTERM under load: {statuses}; exit {code} after {elapsed:.1f} s")
    assert set(statuses) <= {"OK", "UNAVAILABLE"}
    assert statuses[:4] == ["UNAVAILABLE"] * 4  # 900-token turns outlive the 2 s grace
    assert code == 0 and elapsed < 15

"""Supervision with injected faults (LLMSERVE_INJECT_FAULT, see faults.py): a dead
or stuck executor ends the process with a non-zero code instead of a silent hang, and
SIGTERM ends the process even when the executor is stuck."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import start_server

ARGS = ["-np", "2", "-c", "2048", "-t", "2", "--shutdown-grace", "2"]


def _trigger(address: str, request_id: str) -> grpc.StatusCode | None:
    config = session_config(max_tokens=4)
    config.request_id = request_id
    request = pb.GenerateRequest(config=config, input=make_input("Hi"), end_of_turn=True)
    with grpc.insecure_channel(address) as channel:
        try:
            list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=20))
            return None
        except grpc.RpcError as err:
            return err.code()


def _exit_within(process, seconds: float) -> tuple[int | None, float]:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    try:
        code = process.wait(timeout=seconds)
    except Exception:  # noqa: BLE001 - still running: the assertion says so
        process.kill()
        return None, seconds
    return code, time.monotonic() - start


def test_dead_executor_thread_exits_the_process(tmp_path: Path) -> None:
    server = start_server(ARGS, tmp_path / "die.log", env={"LLMSERVE_INJECT_FAULT": "die:kill-the-executor"})
    assert _trigger(server.address, "healthy-call") is None
    status = _trigger(server.address, "kill-the-executor")
    code, _ = _exit_within(server.process, 2.5)
    log = (tmp_path / "die.log").read_text()
    assert status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
    assert code == 70, code
    assert "executor_died" in log and "executor_failed" in log


def test_stuck_executor_is_caught_by_the_watchdog(tmp_path: Path) -> None:
    env = {"LLMSERVE_INJECT_FAULT": "stall:stall-the-executor"}
    server = start_server([*ARGS, "--watchdog-timeout", "2"], tmp_path / "stall.log", env=env)
    started = time.monotonic()
    status = _trigger(server.address, "stall-the-executor")
    code, _ = _exit_within(server.process, 10)
    assert code == 70, code
    assert time.monotonic() - started < 6
    assert status == grpc.StatusCode.UNAVAILABLE
    assert "no executor step" in (tmp_path / "stall.log").read_text()


def test_sigterm_ends_the_process_even_with_a_stuck_executor(tmp_path: Path) -> None:
    env = {"LLMSERVE_INJECT_FAULT": "stall:stall-the-executor"}
    server = start_server([*ARGS, "--watchdog-timeout", "0"], tmp_path / "term.log", env=env)
    with grpc.insecure_channel(server.address) as channel:
        config = session_config(max_tokens=4)
        config.request_id = "stall-the-executor"
        request = pb.GenerateRequest(config=config, input=make_input("Hi"), end_of_turn=True)
        call = pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=30)
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        code, elapsed = _exit_within(server.process, 2 + 5 + 3)  # grace + the stop margin + slack
        try:
            list(call)
        except grpc.RpcError:
            pass
    assert code is not None and code != 0
    assert elapsed < 10
    assert "shutdown_deadline_passed" in (tmp_path / "term.log").read_text()


def test_a_stalled_executor_is_not_ready_but_alive_then_exits(tmp_path: Path) -> None:
    """Readiness (llmserve.v1.LLMService) turns NOT_SERVING once the executor has not
    stepped for half the watchdog's time while liveness ("") stays SERVING; then exit 70."""
    env = {"LLMSERVE_INJECT_FAULT": "stall:stall-the-executor"}
    server = start_server([*ARGS, "--watchdog-timeout", "6"], tmp_path / "ready.log", env=env)
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        ready = health.Watch(health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=30)
        assert next(ready).status == health_pb2.HealthCheckResponse.SERVING
        trigger = threading.Thread(target=_trigger, args=(server.address, "stall-the-executor"))
        started = time.monotonic()
        trigger.start()
        assert next(ready).status == health_pb2.HealthCheckResponse.NOT_SERVING
        not_ready_after = time.monotonic() - started
        alive = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    code, _ = _exit_within(server.process, 15)
    trigger.join(30)
    assert 2.5 < not_ready_after < 5.5, not_ready_after
    assert alive == health_pb2.HealthCheckResponse.SERVING
    assert code == 70


def test_liveness_serves_while_the_model_loads(tmp_path: Path) -> None:
    import subprocess
    import sys

    from harness.server import free_port

    port = free_port()
    # A 2 s pause before the load: gemma-3-270m loads in well under a second on a fast machine.
    env = {**os.environ, "LLMSERVE_INJECT_FAULT": "slow_load:2"}
    process = subprocess.Popen([sys.executable, "-m", "llmserve.service", "serve", "--port", str(port), *ARGS],
                               stdout=(tmp_path / "load.log").open("w"), stderr=subprocess.STDOUT, env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            health = health_pb2_grpc.HealthStub(channel)
            seen = set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                live = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
                ready = health.Check(health_pb2.HealthCheckRequest(service="llmserve.v1.LLMService"), timeout=5).status
                seen.add((live, ready))
                if ready == health_pb2.HealthCheckResponse.SERVING:
                    break
                time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert (SERVING, SERVING) in seen  # ready in the end
    assert all(live == SERVING for live, _ in seen)  # alive throughout, loading or not
    assert (SERVING, NOT_SERVING) in seen, seen  # loading: alive, not ready

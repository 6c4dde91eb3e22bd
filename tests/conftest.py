"""Shared fixtures: the real server, started once per test session on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

# The Node >= 20.10 that `make tools` installs when the system's is older (Makefile, node-tool):
# first on PATH, as `make test` has it, so that pytest run by hand finds the same node and npm.
LOCAL_NODE_BIN = Path(__file__).resolve().parents[1] / ".tools" / "node" / "node_modules" / ".bin"
if LOCAL_NODE_BIN.is_dir() and str(LOCAL_NODE_BIN) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{LOCAL_NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

SERVER_ARGS = ["-np", "8", "-c", "16384", "-t", "2", "--embeddings"]


@dataclass(frozen=True)
class RunningServer:
    address: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int | None = None
    http_port: int | None = None  # the OpenAI HTTP API, when started with one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


READINESS = "llmserve.v1.LLMService"


def start_server(
    args: list[str],
    log_path: Path,
    *,
    metrics: bool = False,
    env: dict[str, str] | None = None,
    channel_factory=grpc.insecure_channel,  # type: ignore[no-untyped-def]
    port: int | None = None,
    metrics_port: int | None = None,
    http_port: int | None = None,
    command: tuple[str, ...] = (sys.executable, "-m", "llmserve.service"),
) -> RunningServer:
    """Start `llmserve serve` as a real process and wait until it is ready (health of
    llmserve.v1.LLMService SERVING: the model is loaded; "" is liveness, at once).
    `command` is the `llmserve` to run (another environment's console script)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = port or free_port()
    metrics_port = metrics_port or (free_port() if metrics else None)
    if metrics_port is not None:
        args = [*args, "--metrics-port", str(metrics_port)]
    if http_port is not None:
        args = [*args, "--http-port", str(http_port)]
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [*command, "serve", "--port", str(port), *args],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    with channel_factory(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-3000:]}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=READINESS), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return RunningServer(address, process, log_path, metrics_port, http_port)
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("server did not become healthy in time")


def server_log_lines(path: Path) -> list[dict[str, Any]]:
    """The server's JSON log lines (a stray non-JSON line from llama.cpp is skipped)."""
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return lines


def stop_server(server: RunningServer) -> int:
    server.process.terminate()
    try:
        return server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(SERVER_ARGS, tmp_path_factory.mktemp("server") / "server.log", metrics=True)
    yield running
    code = stop_server(running)
    assert code == 0, f"server exit code {code}"


@pytest.fixture(scope="session")
def fresh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A second server with the same flags, for runs that must not share the main
    server's prefix cache: a cached prefix computed in another batch would be reused
    (the allocator's job), and llama.cpp's kernels round differently with batch shape."""
    running = start_server(SERVER_ARGS, tmp_path_factory.mktemp("fresh") / "server.log")
    yield running
    assert stop_server(running) == 0


@pytest.fixture(scope="session")
def model_path() -> Path:
    from llmserve.service.model.default_model import default_model_path

    return default_model_path()


ROOT = Path(__file__).resolve().parents[1]
CHAT_SERVER_ARGS = [
    "-np", "4", "-c", "8192", "-t", "2", "--chat-template-file", str(ROOT / "templates" / "gemma3.jinja"),
]


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A second server with a chat template from a file (the default model has none)."""
    running = start_server(CHAT_SERVER_ARGS, tmp_path_factory.mktemp("chat") / "server.log", metrics=True)
    yield running
    assert stop_server(running) == 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Under CI a skip for a missing toolchain fails (tests/toolchains.py says why)."""
    from tests import toolchains

    outcome = yield
    report = outcome.get_result()
    if report.skipped and toolchains.under_ci() and toolchains.is_toolchain_skip(str(report.longrepr)):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=1 and this test's toolchain is missing, so it fails instead of skipping: {reason}"

"""A real `llmserve serve` process on loopback, started and stopped as the tests and the
benchmarks do (`start_server` waits until the model is loaded), and what it leaves behind:
its JSON log lines, its resident memory and threads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES

ROOT = Path(__file__).resolve().parents[1]
GEMMA3_TEMPLATE = PACKAGED_TEMPLATES["gemma3"]
SERVER_ARGS = ["-np", "8", "-c", "16384", "-t", "2", "--embeddings"]  # the tests' session-wide `server`
# A server with a chat template from a file (the same Gemma 3 template the package ships for
# the default model, whose GGUF has none: chat works without the flag too)
CHAT_SERVER_ARGS = ["-np", "4", "-c", "8192", "-t", "2", "--chat-template-file", str(GEMMA3_TEMPLATE)]
READINESS = "llmserve.v1.LLMService"  # the health service name that is SERVING once the model is loaded


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


@contextmanager
def serving(args: list[str], log_path: Path, **options: Any) -> Iterator[RunningServer]:
    """`start_server` for the length of the block (a fixture's life); after it the server
    must stop cleanly (exit code 0), unless the block raised."""
    running = start_server(args, log_path, **options)
    try:
        yield running
    except BaseException:
        stop_server(running)
        raise
    code = stop_server(running)
    assert code == 0, f"server exit code {code}"


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


def rss_kb(pid: int) -> int:
    """A process's resident memory (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def num_threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))

"""`llmserve serve` on an address it cannot listen on: one line naming the address and the
flags to change, a non-zero exit, no traceback (and before the model loads)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmserve.service", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def test_a_grpc_port_in_use(busy_port: int) -> None:
    done = _serve("--port", str(busy_port))
    line = _one_line(done)
    assert done.returncode != 0
    assert f"127.0.0.1:{busy_port}" in line and "--host/--port" in line and "in use" in line, line


def test_a_metrics_port_in_use(busy_port: int) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        grpc_port = free.getsockname()[1]
    done = _serve("--port", str(grpc_port), "--metrics-port", str(busy_port))
    line = _one_line(done)
    assert done.returncode != 0
    assert f"127.0.0.1:{busy_port}" in line and "--metrics-host/--metrics-port" in line, line


def test_an_address_not_on_this_machine() -> None:
    done = _serve("--host", "192.0.2.1", "--port", "50051")  # TEST-NET-1: never a local address
    line = _one_line(done)
    assert done.returncode != 0 and "192.0.2.1:50051" in line and "--host/--port" in line, line


def test_the_metrics_port_on_the_grpc_port() -> None:
    """Both free before either binds: the metrics endpoint finds the port taken by gRPC."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = _serve("--port", str(port), "--metrics-port", str(port))
    line = _one_line(done)
    assert done.returncode != 0 and f"127.0.0.1:{port}" in line and "--metrics-host/--metrics-port" in line, line

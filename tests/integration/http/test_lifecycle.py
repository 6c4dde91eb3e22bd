"""The HTTP API starts, refuses and stops with the gRPC server: 503 while the model loads,
/health 503 once draining, and the port closes when the process ends."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server


def _get(url: str) -> tuple[int, dict, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, dict(reply.headers), json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


def test_loading_then_ready_then_draining(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started: list[RunningServer] = []
    thread = threading.Thread(target=lambda: started.append(start_server(
        [*CHAT_SERVER_ARGS, "--drain-delay", "3"], tmp_path / "server.log", http_port=port,
        env={"LLMSERVE_INJECT_FAULT": "slow_load:4"})))
    thread.start()
    seen: list[int] = []
    while thread.is_alive() and not seen:
        try:
            status, headers, body = _get(f"{base}/v1/models")
            seen.append(status)
            assert status == 503 and headers["Retry-After"] == "1" and body["error"]["type"] == "service_unavailable"
            assert _get(f"{base}/health")[0] == 503
        except OSError:
            time.sleep(0.05)  # not listening yet
    thread.join()
    server = started[0]
    assert seen == [503], "the HTTP port answered while the model loaded"
    status, _, body = _get(f"{base}/health")
    assert status == 200 and body == {"status": "ok"}
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while _get(f"{base}/health")[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _get(f"{base}/health")[0] == 503  # not ready at once
    assert _get(f"{base}/v1/models")[0] == 200  # still served during --drain-delay
    assert server.process.wait(timeout=30) == 0


def test_a_busy_http_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "llmserve.service", "serve", "--port", str(free_port()),
                               "--http-port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"llmserve: cannot listen on 127.0.0.1:{port} for HTTP (Address already in use): "
        "choose another address with --host/--http-port")

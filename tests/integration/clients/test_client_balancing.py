"""Client-side load balancing: one Client over two real server processes (round_robin)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from llmserve.client import Client

from harness.server import start_server, stop_server

ARGS = ["-np", "2", "-c", "2048", "-t", "1"]


def _turns(log: Path) -> int:
    return log.read_text().count('"event": "turn_end"')


def test_round_robin_over_two_servers_and_one_dies(tmp_path: Path) -> None:
    a = start_server(ARGS, tmp_path / "a.log")
    b = start_server(ARGS, tmp_path / "b.log")
    try:
        with Client([a.address, b.address], timeout=30, wait_for_ready=True) as client:
            for i in range(20):
                assert client.generate(f"Call {i}:", max_tokens=2).turn_end.usage.completion_tokens == 2
            time.sleep(0.3)
            spread = (_turns(a.log_path), _turns(b.log_path))
            assert min(spread) >= 5, spread  # both servers took calls
            a.process.send_signal(signal.SIGKILL)
            a.process.wait(10)
            time.sleep(0.5)
            failures = 0
            for i in range(10):
                try:
                    client.generate(f"After the failure {i}:", max_tokens=2)
                except Exception:  # noqa: BLE001 - counted
                    failures += 1
        print(f"calls per server before the kill: {spread}; failed calls after it: {failures}")
        assert failures == 0
    finally:
        stop_server(b)

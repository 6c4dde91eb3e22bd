"""Slowloris and friends on the HTTP surface (http/connections.py): connections that stay
idle, send half their headers, half their body, or dribble a byte at a time are closed
within --timeout / --http-keepalive-timeout (a 408 where a request had begun), the
server's descriptors come back, connections over --http-max-connections are refused at
once while an open one is still served, and a response stream longer than --timeout is
not cut. Short timeouts via the flags keep it quick."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing

import pytest
from openai import OpenAI

from harness.metrics import counted, metric
from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

TIMEOUT = 3.0  # --timeout and --http-keepalive-timeout
MARGIN = 3.0  # the sweeper's interval (TIMEOUT / 4) and a busy machine
CAP = 64  # --http-max-connections
CHAT_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*CHAT_SERVER_ARGS, "--timeout", str(TIMEOUT), "--http-keepalive-timeout", str(TIMEOUT),
            "--http-max-connections", str(CAP)]
    running = start_server(args, tmp_path_factory.mktemp("http-conn") / "server.log", http_port=free_port(),
                           metrics=True)
    yield running
    assert stop_server(running) == 0


def _fds(server: RunningServer) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def _open(server: RunningServer, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
    if first:
        sock.sendall(first)
    return sock


def _until_closed(sock: socket.socket, deadline: float) -> tuple[bytes, float]:
    """What the server wrote before closing, and when it closed; fails past `deadline`."""
    data = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            raise AssertionError(f"still open at the deadline, after {data[:80]!r}") from None
        if not chunk:
            sock.close()
            return data, time.monotonic()
        data += chunk


def _wait_fds(server: RunningServer, condition, what: str) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while not condition(count := _fds(server)):
        assert time.monotonic() < deadline, f"{what}: the server holds {count} descriptors"
        time.sleep(0.05)
    return count


def _settled(server: RunningServer) -> int:
    """The descriptor count once the last client's connection is gone (the same twice, 0.3 s apart)."""
    time.sleep(0.3)
    return _fds(server)


def _dribble(socks: list[socket.socket], stop: threading.Event) -> None:
    """Slowloris proper: one more header byte every 0.3 s, each byte in time for any per-read timeout."""
    while not stop.wait(0.3):
        for sock in socks:
            try:
                sock.send(b"x")
            except OSError:
                pass


def _chat_works(server: RunningServer) -> None:
    with OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0, timeout=60) as client:
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                               max_tokens=8)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1


def test_stalled_connections_are_closed_and_their_descriptors_come_back(server: RunningServer) -> None:
    _chat_works(server)  # the server's own descriptors settle (pools, threads) before the baseline
    baseline = _wait_fds(server, lambda n: n == _settled(server), "before the attack")
    begun = time.monotonic()
    idle = [_open(server) for _ in range(15)]
    headers = [_open(server, CHAT_HEAD + b"Content-Le") for _ in range(15)]
    bodies = [_open(server, CHAT_HEAD + b'Content-Length: 5000\r\n\r\n{"messages": [') for _ in range(15)]
    dribbling = [_open(server, CHAT_HEAD) for _ in range(5)]
    stop = threading.Event()
    threading.Thread(target=_dribble, args=(dribbling, stop), daemon=True).start()
    try:
        _wait_fds(server, lambda n: n >= baseline + 50, "the stalled connections were not all accepted")
        with closing(http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)) as health:  # meanwhile
            health.request("GET", "/health")
            assert health.getresponse().status == 200
        _chat_works(server)
        deadline = begun + TIMEOUT + MARGIN + 5  # + the chat's own time
        for group, reply in ((idle, b""), (headers, b"HTTP/1.1 408"), (bodies, b"HTTP/1.1 408"),
                             (dribbling, b"HTTP/1.1 408")):
            for sock in group:
                data, closed_at = _until_closed(sock, deadline)
                assert data.startswith(reply), data[:200]
                assert closed_at - begun >= TIMEOUT * 0.9, "closed before its timeout: not the timeout's doing"
        assert b"--timeout" in data  # the 408 says which flag
    finally:
        stop.set()
    _wait_fds(server, lambda n: n <= baseline + 2, "after the stalled connections closed")
    assert counted(server.metrics_port, 'llmserve_http_connections_closed_total{reason="header_timeout"}') >= 20
    assert counted(server.metrics_port, 'llmserve_http_connections_closed_total{reason="body_timeout"}') >= 15
    assert counted(server.metrics_port, 'llmserve_http_connections_closed_total{reason="idle"}') >= 15


def test_connections_over_the_cap_are_refused_while_an_open_one_is_served(server: RunningServer) -> None:
    with closing(http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)) as kept:
        kept.request("GET", "/health")
        assert kept.getresponse().read() == b'{"status": "ok"}'
        begun = time.monotonic()
        open_now = int(metric(server.metrics_port, "llmserve_http_connections"))
        fillers = [_open(server) for _ in range(CAP - open_now)]
        refused_before = counted(server.metrics_port, 'llmserve_http_connections_closed_total{reason="refused"}')
        extras = [_open(server) for _ in range(5)]
        for sock in extras:
            data, _closed_at = _until_closed(sock, time.monotonic() + 2)
            assert data.startswith(b"HTTP/1.1 503") and b"--http-max-connections" in data, data[:200]
        kept.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}), headers={"Content-Type": "application/json"})
        reply = kept.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["choices"][0]["message"]["content"] is not None
        assert time.monotonic() - begun < TIMEOUT, "too slow to tell: the fillers may have timed out"
        assert counted(server.metrics_port, 'llmserve_http_connections_closed_total{reason="refused"}') - refused_before == 5
        for sock in fillers:
            sock.close()
    with closing(http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)) as fresh:  # room again
        fresh.request("GET", "/health")
        assert fresh.getresponse().status == 200


def test_a_stream_longer_than_the_timeout_is_not_cut(server: RunningServer) -> None:
    """A stream read for longer than --timeout (and --http-keepalive-timeout), with the
    sweeper's interval to spare, is still delivering tokens when the client leaves."""
    with OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="x", max_retries=0, timeout=120) as client:
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Count to one thousand."}], max_tokens=2000,
            stream=True, extra_body={"ignore_eos": True})
        begun, tokens = time.monotonic(), 0
        for chunk in stream:
            assert chunk.choices[0].finish_reason is None, "the stream ended before the client left"
            tokens += 1
            if time.monotonic() - begun > TIMEOUT + 2:
                break
        stream.close()
    assert tokens > 10

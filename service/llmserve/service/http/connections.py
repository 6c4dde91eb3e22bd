"""Connection hygiene for the HTTP surface: a read/write timeout, an idle keep-alive
timeout and a cap on open connections (surface.py's `start()` listens through a
`ConnectionGuard`).

aiohttp has no timer between a request's first byte and its handler, nor while its body
arrives, and its keep-alive timer (3,630 s by default) only ends a connection waiting for
a request: a client that sends headers or a body slowly (slowloris) holds a descriptor
for an hour. So every accepted connection is a `_Connection`, an asyncio protocol in
front of aiohttp's `RequestHandler` that forwards every event and records what the
connection is doing; `middleware` marks when a request's headers are in and reads its
body against the deadline; one sweeper task closes what overstays:

| the connection | allowed | then |
|---|---|---|
| open, or between requests, no byte received | `--http-keepalive-timeout` | closed |
| a request's first byte in, its headers not complete | `--timeout` from that byte | 408, closed |
| its headers in, its body still arriving | `--timeout` from its first byte | 408, closed |
| in its route's handler, a stream included | no bound here (`--reader-timeout` ends a stalled reader's stream) | |
| between requests, a reply queued that the client does not read | `--timeout` without progress | aborted |
| accepted while `--http-max-connections` are open | nothing | 503, closed at once |

Every close is counted (`llmserve_http_connections_closed{reason}`) and logged at most
once per LOG_EVERY_S per reason. gRPC's connections are grpc's own (`--keepalive-*`).
"""

from __future__ import annotations

import asyncio
import enum
import json
import resource
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from ..config import HttpConnectionSettings
from ..metrics import Metrics
from .errors import ApiError

log = structlog.get_logger("llmserve.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AUTO_MAX_CONNECTIONS = 1024  # the cap when --http-max-connections is unset, at most half the open-file limit
LOG_EVERY_S = 10.0  # a flood of closes logs one line per reason this often, with its count
REPLY_GRACE_S = 0.5  # a 408 written through aiohttp gets this long to leave before the connection closes


@dataclass(frozen=True)
class ConnectionLimits:
    read_timeout_s: float  # --timeout: a request's headers and body, a stalled reply
    keepalive_timeout_s: float  # --http-keepalive-timeout: no byte between requests
    max_connections: int  # --http-max-connections, resolved

    @classmethod
    def of(cls, settings: HttpConnectionSettings) -> ConnectionLimits:
        """The flags' limits; an unset cap is AUTO_MAX_CONNECTIONS, at most half the
        process's open-file limit (the other half: models, gRPC, logs)."""
        cap = settings.http_max_connections
        if cap is None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            cap = AUTO_MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(1, min(AUTO_MAX_CONNECTIONS, soft // 2))
        return cls(settings.timeout, settings.http_keepalive_timeout, cap)

    @property
    def sweep_interval_s(self) -> float:
        return min(1.0, max(0.05, min(self.read_timeout_s, self.keepalive_timeout_s) / 4))

    @property
    def aiohttp_keepalive_s(self) -> float:
        """aiohttp's own keep-alive timer, a backstop that never fires before ours."""
        return self.keepalive_timeout_s + self.read_timeout_s + 2 * self.sweep_interval_s


class Phase(enum.Enum):
    WAITING = "waiting"  # for a request: idle, or its headers arriving
    BODY = "body"  # its headers in (its handler called), its body arriving
    HANDLING = "handling"  # in the route's handler: a stream as long as it takes


def _raw_reply(status: int, reason: str, error: ApiError) -> bytes:
    """A whole HTTP/1.1 reply written straight to a transport aiohttp is not answering on."""
    body = json.dumps(error.body()).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in error.headers().items())
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n{extra}\r\n")
    return head.encode("ascii") + body


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's `RequestHandler` behind it, and what it is doing."""

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol, now: float) -> None:
        self._guard = guard
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.refused = False  # over the cap: aiohttp never saw it
        self.phase = Phase.WAITING
        self.waiting_since = now
        self.request_began: float | None = None  # the first byte of the request being read
        self._queued, self._queued_since = 0, now  # bytes waiting to be written, unchanged since

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._guard.admit(self):
            self.refused = True
            transport.write(self._guard.refusal)
            transport.close()
            return
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.request_began is None:
            self.request_began = self._guard.now()
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.refused:
            self._guard.forget(self)
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    # ------------------------------------------------------------ what the middleware and sweeper see

    def begin_request(self, now: float) -> None:
        self.phase = Phase.BODY
        if self.request_began is None:  # a pipelined request whose bytes came during the last one
            self.request_began = now

    def end_request(self, now: float) -> None:
        self.phase, self.waiting_since, self.request_began = Phase.WAITING, now, None

    def overstayed(self, now: float, limits: ConnectionLimits) -> str | None:
        """Why this connection must close now (a `reason` label), or None."""
        if self.phase is not Phase.WAITING or self.transport is None or self.transport.is_closing():
            return None  # a body's deadline is the middleware's; a handler runs unbounded
        if self.request_began is not None:
            return "header_timeout" if now - self.request_began > limits.read_timeout_s else None
        queued = self.transport.get_write_buffer_size()
        if queued != self._queued:
            self._queued, self._queued_since = queued, now
        if queued:
            return "write_timeout" if now - self._queued_since > limits.read_timeout_s else None
        idle_since = max(self.waiting_since, self._queued_since)
        return "idle" if now - idle_since > limits.keepalive_timeout_s else None

    def close(self, reason: str) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if reason == "write_timeout":
            transport.abort()  # close() would wait for the unread reply to leave
            return
        if reason == "header_timeout":
            transport.write(self._guard.timeout_reply)
        transport.close()


class ConnectionGuard:
    """Listens for the HTTP surface and bounds its connections (the table above).
    `listen` starts it, `middleware` goes innermost in the app's middlewares (after
    authentication: a refused client's body is never read), `stop` ends the listening."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics) -> None:
        self.limits = limits
        self._metrics = metrics
        self._open: dict[asyncio.Protocol, _Connection] = {}  # aiohttp's handler -> its connection
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._logged: dict[str, tuple[float, int]] = {}  # reason -> (last logged, closes since)
        self.timeout_reply = _raw_reply(408, "Request Timeout", self._timeout_error())
        self.refusal = _raw_reply(503, "Service Unavailable", ApiError(
            503, f"the server has {limits.max_connections} HTTP connections open (--http-max-connections)",
            "service_unavailable", retry_after_s=1.0))

    def now(self) -> float:
        return self._loop.time()

    async def listen(self, server: web.Server, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        """Accept on host:port, each connection behind a `_Connection` for aiohttp's `server`."""
        self._listener = await self._loop.create_server(
            lambda: _Connection(self, server(), self.now()), host, port, ssl=ssl_context, reuse_address=True,
            ssl_handshake_timeout=self.limits.read_timeout_s if ssl_context is not None else None)
        self._sweeper = asyncio.create_task(self._sweep(), name="http-connection-sweeper")
        log.info("http_connection_limits", timeout_s=self.limits.read_timeout_s,
                 keepalive_timeout_s=self.limits.keepalive_timeout_s, max_connections=self.limits.max_connections)

    def stop(self) -> None:
        """No new connections; aiohttp's runner then closes the open ones."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            self._listener.close()

    def admit(self, connection: _Connection) -> bool:
        if len(self._open) >= self.limits.max_connections:
            self._closed("refused")
            return False
        self._open[connection.handler] = connection
        self._metrics.http_connections.set(len(self._open))
        return True

    def forget(self, connection: _Connection) -> None:
        self._open.pop(connection.handler, None)
        self._metrics.http_connections.set(len(self._open))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The request's body read by its deadline (a 408 otherwise), then its handler,
        unbounded; the body stays cached for the route's own `request.read()`."""
        connection = self._open.get(request.protocol)
        if connection is None:
            return await handler(request)
        connection.begin_request(self.now())
        try:
            if request.body_exists and not await self._read_body(request, connection):
                self._closed("body_timeout")
                self._loop.call_later(REPLY_GRACE_S, connection.close, "body_timeout")
                error = self._timeout_error()
                response = web.json_response(error.body(), status=error.status)
                response.force_close()
                return response
            connection.phase = Phase.HANDLING
            return await handler(request)
        finally:
            connection.end_request(self.now())

    async def _read_body(self, request: web.Request, connection: _Connection) -> bool:
        assert connection.request_began is not None
        remaining = connection.request_began + self.limits.read_timeout_s - self.now()
        try:
            await asyncio.wait_for(request.read(), max(0.0, remaining))
        except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on
            return False
        return True

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.limits.sweep_interval_s)
            now = self.now()
            for connection in list(self._open.values()):
                reason = connection.overstayed(now, self.limits)
                if reason is not None:
                    connection.close(reason)
                    self._closed(reason)

    def _closed(self, reason: str) -> None:
        """Counted always; logged at most once per LOG_EVERY_S per reason."""
        self._metrics.http_connections_closed.labels(reason=reason).inc()
        last, count = self._logged.get(reason, (float("-inf"), 0))
        now = self.now()
        if now - last < LOG_EVERY_S:
            self._logged[reason] = (last, count + 1)
            return
        self._logged[reason] = (now, 0)
        log.warning("http_connection_closed", reason=reason, count=count + 1, open=len(self._open),
                    max_connections=self.limits.max_connections)

    def _timeout_error(self) -> ApiError:
        return ApiError(408, f"the request's headers and body did not arrive within {self.limits.read_timeout_s:g} s "
                             "(--timeout)", "timeout", code="request_timeout")

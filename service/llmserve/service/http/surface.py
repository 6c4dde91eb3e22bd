"""The OpenAI HTTP surface: an aiohttp server on the gRPC server's event loop.

The process (process.py) runs it as a `Surface`, beside gRPC's: it listens when gRPC
does, answers 503 while the model loads and once the server drains (the `OpenCalls` both
surfaces count their calls in), and stops with it.
Routes: `GET /health` (200 only when ready, as gRPC health's readiness), `GET /v1/models`,
`POST /v1/chat/completions`, `POST /v1/completions` (completions.py), `POST /v1/embeddings`
(embeddings.py). Every error is OpenAI's error object (errors.py); every
response carries `x-request-id` (the client's, else a new one), which the request's log
lines carry too. The same `--api-key` applies as `Authorization: Bearer`; `/health` needs
none, as gRPC health. Every request is counted, timed and traced (telemetry.py); an
`x-request-timeout` header (seconds) ends the request's turns as a gRPC deadline does.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import os
import re
import socket
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import structlog
from aiohttp import web

from ..config import ServerConfig
from ..domain import request_rules
from ..engine.engine import Engine
from ..load_report import TRAILER, LoadReporter
from ..metrics import Metrics
from ..open_calls import OpenCalls
from ..served_models import ServedModels
from . import adapters, anthropic
from .agent_routes import AgentRoutes
from .chat import ChatResponder
from .completion_request import parse_completion
from .completions import CompletionResponder
from .connections import ConnectionGuard, ConnectionLimits
from .embeddings import embed, embedding_model_of, model_names, parse_embeddings
from .errors import ApiError, from_exception, server_error, unavailable
from .fields import known_model
from .request import SURFACE, parse_chat
from .responses_request import responses_param
from .routing import ModelRouter
from .telemetry import Telemetry, request_deadline

log = structlog.get_logger("llmserve.http")

MAX_REQUEST_ID_LENGTH = request_rules.MAX_REQUEST_ID_LENGTH
_REQUEST_ID = re.compile(f"[\\x20-\\x7e]{{1,{MAX_REQUEST_ID_LENGTH}}}")  # printable ASCII
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN = ("/health",)  # served without the API key
ANTHROPIC_ROUTES = "/v1/messages"  # errors in Anthropic's shape
RESPONSES_ROUTES = "/v1/responses"  # errors name the Responses body's fields
SEND_BUFFER_BYTES = 64 * 1024  # an event stream's socket send buffer (the kernel doubles it)


class HttpSurface:
    def __init__(self, config: ServerConfig, metrics: Metrics, calls: OpenCalls, load: LoadReporter,
                 models: ServedModels) -> None:
        assert config.http_port is not None
        self.config = config
        self.models = models
        self._router = ModelRouter(self._engine_or_503, models)  # routing.py: which model serves a body
        self.metrics = metrics
        self.calls = calls
        self.load = load
        self._engine: Callable[[], Engine | None] = lambda: None
        self._ready: Callable[[], bool] = lambda: False
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------ lifecycle (Surface)

    async def start(self, engine: Callable[[], Engine | None], ready: Callable[[], bool]) -> None:
        """Listen (OSError, one line, if it cannot); `engine()` None while the model loads,
        `ready()` readiness, asked at each `GET /health`."""
        self._engine, self._ready = engine, ready
        metrics, load = self.metrics, self.load
        telemetry = Telemetry(metrics, traced=self.config.otlp_traces_endpoint is not None)
        self._guard = guard = ConnectionGuard(ConnectionLimits.of(self.config.http), metrics)  # connections.py
        app = web.Application(middlewares=[telemetry.middleware, self._errors, self._auth, guard.middleware],
                              client_max_size=self.config.max_message_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/lora-adapters", lambda _: web.json_response(adapters.lora_adapters(self._engine_or_503())))
        app.router.add_post("/v1/load_lora_adapter", lambda request: adapters.load(self._engine_or_503(), request))
        app.router.add_post("/v1/unload_lora_adapter", lambda request: adapters.unload(self._engine_or_503(), request))
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        agents = AgentRoutes(self._router, self._model_names, self.calls)  # agent_routes.py
        app.router.add_post("/v1/messages", agents.messages)
        app.router.add_post("/v1/messages/count_tokens", agents.count_tokens)
        app.router.add_post("/v1/responses", agents.responses)
        app.router.add_post("/v1/responses/input_tokens", agents.input_tokens)
        app.router.add_route("GET", "/v1/responses/{response_id}", agents.stored_response)
        app.router.add_route("DELETE", "/v1/responses/{response_id}", agents.stored_response)
        app.router.add_get("/v1/responses/{response_id}/input_items", agents.input_items)
        app.router.add_post("/v1/responses/{response_id}/cancel", agents.cancel)
        app.on_response_prepare.append(_echo_request_id)
        app.on_response_prepare.append(_bound_send_buffer)
        app.on_response_prepare.append(_load_report(load))
        telemetry.know_routes(app)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0,
                                     keepalive_timeout=guard.limits.aiohttp_keepalive_s)
        await self._runner.setup()
        host, port = self.config.host, self.config.http_port
        try:
            await guard.listen(self._runner.server, host, port, _tls(self.config))
        except OSError as exc:
            await self._runner.cleanup()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise OSError(f"cannot listen on {host}:{port} for HTTP ({reason}): "
                          "choose another address with --host/--http-port") from None
        log.info("http_listening", host=host, http_port=port, api="openai", tls=self.config.tls_cert is not None)

    async def set_health(self, alive: bool | None = None, ready: bool | None = None) -> None:
        """Nothing to keep: `GET /health` asks `ready()` each time."""

    async def stop(self, now: bool = False) -> None:
        """Requests still open get aiohttp's shutdown timeout (2 s) either way."""
        if self._runner is not None:
            self._guard.stop()
            await self._runner.cleanup()

    # ------------------------------------------------------------ middlewares

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("x-request-id")
        request["request_id"] = rid = given if given and _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        structlog.contextvars.bind_contextvars(request_id=rid, route=request.path)
        try:
            if given and rid != given:  # never echoed: a header must stay printable ASCII
                raise ApiError(400, f"x-request-id takes 1 to {MAX_REQUEST_ID_LENGTH} printable ASCII characters",
                               param="x-request-id")
            with self.calls.counted():
                return await handler(request)
        except web.HTTPException as exc:  # aiohttp's own: no route (404), wrong method (405), too large (413)
            if exc.status < 400:
                raise
            message = exc.reason or "error"
            if exc.status == 413:
                message = f"the body is larger than {self.config.max_message_bytes} bytes (--max-message-bytes)"
            return _error_response(ApiError(exc.status, message, "invalid_request_error"), request.path)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every exit maps to one status here
            error = from_exception(exc)
            if error is None:
                log.exception("http_internal_error")
                error = server_error()
            return _error_response(error, request.path)
        finally:
            structlog.contextvars.unbind_contextvars("request_id", "route")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.config.api_key
        if key and request.path not in _OPEN:
            given = request.headers.get("Authorization", "")
            if not given and "x-api-key" in request.headers:  # Anthropic's clients send the key so
                given = f"Bearer {request.headers['x-api-key']}"
            # aiohttp keeps a header's non-UTF-8 bytes as surrogate escapes: compared as the bytes sent
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {key}".encode()):
                raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <--api-key>'",
                               code="invalid_api_key")
        return await handler(request)

    # ------------------------------------------------------------ routes

    def _engine_or_503(self) -> Engine:
        engine = self._engine()
        if self.calls.draining:
            raise unavailable("the server is shutting down")
        if engine is None:
            raise unavailable("the model is still loading", retry_after_s=1.0)
        return engine

    async def _health(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.json_response({"status": "ok"})
        loading = self._engine() is None
        raise unavailable("the model is still loading" if loading else "not ready (draining or stalled)",
                          retry_after_s=1.0 if loading else None)

    def _model_names(self, engine: Engine) -> tuple[str, ...]:
        """The alias (`--alias`, default the model file's stem) and the model's id (its file name)."""
        alias, name = engine.model_name, Path(engine.meta.path).name
        return (alias, name) if name != alias else (alias,)

    async def _models(self, request: web.Request) -> web.Response:
        engine = self._engine_or_503()
        created = _created(Path(engine.meta.path))
        names = self._model_names(engine)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "llmserve"} for name in names]
        data += adapters.model_entries(engine, names[0], created)
        for name in self.models.names()[1:]:  # the further models (--model NAME=PATH)
            path = self.models.spec(name).path
            data.append({"id": name, "object": "model", "created": _created(path), "owned_by": "llmserve",
                         "root": str(path), "status": {"value": self.models.state(name)}})
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        async with self._router.body(request, lambda e: lambda value: parse_chat(value, e.tool_format)) as routed:
            engine, chat = routed[0], replace(routed[1], deadline=request_deadline(request))
            model, chosen = adapters.model_and_adapters(engine, chat.model, chat.lora, self._model_names(engine))
            params = replace(chat.session_params(request["request_id"], engine.limits), surface=SURFACE,
                             adapters=chosen)
            with engine.session_gate.admitted():  # open sessions of both surfaces: the slots plus --max-queue
                responder = ChatResponder(engine, chat, params, model)
                return await (responder.stream(request) if chat.stream else responder.whole())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        async with self._router.body(request, lambda _: parse_completion) as routed:
            engine, completion = routed[0], replace(routed[1], deadline=request_deadline(request))
            model, chosen = adapters.model_and_adapters(engine, completion.model, completion.lora,
                                                        self._model_names(engine))
            params = replace(completion.session_params(request["request_id"], engine.limits), surface=SURFACE,
                             adapters=chosen)
            num_prompts = len(completion.prompts)  # each prompt is a session of its own
            if num_prompts > engine.session_gate.capacity:
                raise ApiError(400, f"{num_prompts} prompts; one request may send up to "
                                    f"{engine.session_gate.capacity}: the slots plus --max-queue", param="prompt")
            with engine.session_gate.admitted(num_prompts):
                responder = CompletionResponder(engine, completion, params, model)
                return await (responder.stream(request) if completion.stream else responder.whole())

    async def _embeddings(self, request: web.Request) -> web.Response:
        async with self._router.body(request, lambda _: parse_embeddings, "embeddings") as (engine, body):
            embedder = embedding_model_of(engine, self._model_names(engine))
            model = known_model(body.model, model_names(embedder, self._model_names(engine)))
            with engine.session_gate.admitted():  # a place like a session's: the slots plus --max-queue
                return web.Response(body=await embed(engine, embedder, body, model), content_type="application/json")


def _created(path: Path) -> int:
    """The model file's time, as OpenAI's `created`."""
    return int(path.stat().st_mtime) if path.exists() else 0


def _tls(config: ServerConfig) -> ssl.SSLContext | None:
    """The gRPC port's TLS for HTTP too: the same certificate, and with --tls-client-ca the
    same client certificates required (mTLS)."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca is not None:
        context.load_verify_locations(config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    if "request_id" in request:
        response.headers["x-request-id"] = request["request_id"]


def _load_report(load: LoadReporter) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    async def report(request: web.Request, response: web.StreamResponse) -> None:
        """Every API call counts toward the replica's call rate, and its reply's headers carry
        the load report (Envoy's client_side_weighted_round_robin reads it per response)."""
        if request.method == "POST" and request.path.startswith("/v1/"):
            load.call_started()
            response.headers[TRAILER] = base64.b64encode(load.report().SerializeToString()).decode("ascii")
    return report


async def _bound_send_buffer(request: web.Request, response: web.StreamResponse) -> None:
    """An event stream's kernel send buffer stays small: a client that stops reading then
    backs its events up within about SEND_BUFFER_BYTES, so the stalled-reader rule pauses
    it (and --reader-timeout ends it) as it does a gRPC stream; Linux's autotuning would
    first buffer up to tcp_wmem's 4 MiB, thousands of tokens."""
    if response.content_type == "text/event-stream" and request.transport is not None:
        sock = request.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)


def _error_response(error: ApiError, path: str) -> web.Response:
    """OpenAI's error object (the Responses body's field names on its routes); Anthropic's on its routes."""
    if path.startswith(RESPONSES_ROUTES):
        error.param = responses_param(error.param)
    body = anthropic.error_body(error) if path.startswith(ANTHROPIC_ROUTES) else error.body()
    return web.json_response(body, status=error.status, headers=error.headers())

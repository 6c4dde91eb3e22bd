"""gRPC transport for LLMService: admission, request ids, and the call types.

The servicer converts and streams; `GenerateCall` and `EmbedCall` run the two
streaming calls, `validation` checks requests, `errors` decides every status.
Each call counts in the process's `OpenCalls` (shared with the HTTP surface), which the
drain waits for; once it drains, new calls get UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc
import structlog
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from ..domain.requests import SessionParams
from ..engine.engine import Engine, ToolFormat, ToolPlan, owner_of
from ..metrics import Metrics
from ..open_calls import OpenCalls
from ..served_models import Purpose, ServedModels
from . import adapters, responses, unary, validation
from .embed_call import EmbedCall
from .errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable, check_decoded, rpc_errors
from .generate_call import Drain, GenerateCall, stored_conversation
from .tool_config import tool_plan

log = structlog.get_logger("llmserve.servicer")

MAX_REQUEST_ID_LENGTH = validation.MAX_REQUEST_ID_LENGTH
LARGE_CONFIG_BYTES = 64 * 1024  # a larger first message's tools and constraint are checked on the offload pool


def request_id(context: grpc.aio.ServicerContext, configured: str = "") -> str:
    """The call's id: the request's own, else `x-request-id` metadata, else a new one."""
    if configured:
        return configured
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and value:
            if len(value) > MAX_REQUEST_ID_LENGTH:
                raise InvalidArgument("x-request-id is too long", field="x-request-id")
            return str(value)
    return uuid.uuid4().hex


def one_turn(request: pb.GenerateOnceRequest | pb.GenerateTextRequest) -> pb.GenerateRequest:
    """A one-shot request as a session's first (and only) message."""
    if not request.HasField("config"):
        raise InvalidArgument("the request must carry the session config", field="config")
    return pb.GenerateRequest(config=request.config, input=request.input, end_of_turn=True)


async def _no_more_input():  # type: ignore[no-untyped-def]
    """A request stream the client half-closed after its first message."""
    return
    yield


def bind_request(context: grpc.aio.ServicerContext, rpc: str, rid: str) -> None:
    structlog.contextvars.bind_contextvars(request_id=rid, rpc=rpc)


class LLMServicer(pb_grpc.LLMServiceServicer):
    def __init__(self, metrics: Metrics, calls: OpenCalls, max_queue: int, models: ServedModels) -> None:
        self.engine: Callable[[], Engine | None] = lambda: None  # None until the model has loaded
        self.models = models
        self.metrics = metrics
        self.max_queue = max_queue
        self.calls = calls
        self._generate_calls: set[GenerateCall] = set()
        calls.on_drain(self._drain_sessions)

    def _engine(self) -> Engine:
        engine = self.engine()
        if self.calls.draining:
            raise Unavailable("the server is shutting down")
        if engine is None:
            raise Unavailable("the model is still loading", retry_after_s=1.0)
        return engine

    @asynccontextmanager
    async def _model(self, name: str, field: str = "model", purpose: Purpose = "any") -> AsyncIterator[Engine]:
        """The engine of the model called `name` (empty: the default one), held for the block
        (served_models.py); NOT_FOUND naming `field` when nothing serves it, FAILED_PRECONDITION
        when it does not serve the call's `purpose` (an embedding model generates nothing)."""
        default = self._engine()
        if name and name not in self.models.names():
            raise NotFound(f"no model is called {name!r}; this server serves {', '.join(self.models.names())}",
                           field=field)
        async with self.models.held(default, name, field, purpose) as engine:
            yield engine

    def _drain_sessions(self) -> None:
        """Sessions end UNAVAILABLE once their open turn is done."""
        for call in self._generate_calls:
            call.sink.put_local(Drain())

    # ----------------------------------------------------------------- Generate

    async def _first_message(self, request_iterator, engine: Engine) -> pb.GenerateRequest:  # type: ignore[no-untyped-def]
        timeout = engine.config.first_message_timeout_s
        try:
            first = await asyncio.wait_for(anext(aiter(request_iterator), None), timeout)
        except TimeoutError:
            raise DeadlineExceeded(
                f"no first message within {timeout:g} s (--first-message-timeout)", field="config"
            ) from None
        first = check_decoded(first) if first is not None else None
        if first is None:
            raise InvalidArgument("the stream ended before its first message", field="config")
        if not first.HasField("config"):
            raise InvalidArgument("the first message must carry the session config", field="config")
        return first

    async def _session_params(
        self, engine: Engine, first: pb.GenerateRequest, rid: str
    ) -> tuple[SessionParams, object | None, ToolPlan | None]:
        """The session's parameters, its constraint compiled (off the loop and the executor)
        and its tools."""
        params = validation.session_params(first.config, engine.limits, rid)  # cheap checks first
        params = replace(params, adapters=adapters.session_adapters(engine, first.config))
        # megabytes of tools or schema are checked off the loop that serves every call
        tools, constraint = await engine.off_loop(first.config.ByteSize(), _tools_and_constraint, first.config,
                                                  engine.tool_format, large=LARGE_CONFIG_BYTES)
        if constraint is None:
            return params, None, tools
        kind, text = constraint
        field = f"config.{tools.field}" if tools is not None and tools.active else f"config.constraint.{kind}"
        gbnf, compiled = await engine.compile_async(kind, text, field)  # Overloaded: RESOURCE_EXHAUSTED
        return replace(params, sampling=replace(params.sampling, grammar=gbnf)), compiled, tools

    @rpc_errors
    async def Generate(self, request_iterator, context):  # type: ignore[no-untyped-def]
        with self.calls.counted():
            first = await self._first_message(request_iterator, self._engine())
            async with self._model(first.config.model, "config.model", "generation") as engine:
                async for response in self._session(engine, first, request_iterator, context, "Generate"):
                    yield response

    @rpc_errors
    async def GenerateOnce(self, request, context):  # type: ignore[no-untyped-def]
        """A session of one turn: the request is its first message, then a half-close."""
        first = one_turn(check_decoded(request))
        with self.calls.counted():
            async with self._model(first.config.model, "config.model", "generation") as engine:
                async for response in self._session(engine, first, _no_more_input(), context, "GenerateOnce"):
                    yield pb.GenerateOnceResponse.FromString(response.SerializeToString())  # the same fields

    @rpc_errors
    async def GenerateText(self, request, context):  # type: ignore[no-untyped-def]
        first = one_turn(request)
        with self.calls.counted():
            async with self._model(first.config.model, "config.model", "generation") as engine:
                return responses.text_response(
                    [r async for r in self._session(engine, first, _no_more_input(), context, "GenerateText")])

    async def _session(self, engine: Engine, first, request_iterator, context, rpc: str):  # type: ignore[no-untyped-def]
        rid = request_id(context, first.config.request_id)
        bind_request(context, rpc, rid)
        with engine.session_gate.admitted():  # open sessions of both surfaces: the slots plus --max-queue
            async for response in self._run_session(engine, first, rid, request_iterator, context):
                yield response

    async def _run_session(self, engine: Engine, first, rid: str, request_iterator, context):  # type: ignore[no-untyped-def]
        params, grammar, tools = await self._session_params(engine, first, rid)
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        credentials = dict(context.invocation_metadata() or ()).get("authorization", "")
        continues = stored_conversation(engine, first.config, credentials)  # continue_from: HTTP's stored turns
        restore = await engine.named_sessions.claim(params.session_id)  # one stream per session id
        prefix = await engine.stored_kv.continued(first.config.continue_from, continues) if continues else None
        call = GenerateCall(engine, first, params, deadline, restore, grammar, tools, continues, owner_of(credentials),
                            prefix)
        self._generate_calls.add(call)
        if self.calls.draining:
            call.sink.put_local(Drain())
        try:
            async for response in call.run(request_iterator):
                yield response
            if params.session_id and (fault := engine.session_store_fault):  # served; its save may fail too
                context.set_trailing_metadata((("llmserve-session-store-fault", fault.encode("ascii", "replace").decode()),))
        finally:
            self._generate_calls.discard(call)
            engine.named_sessions.release(params.session_id)

    # -------------------------------------------------------------------- Embed

    @rpc_errors
    async def Embed(self, request_iterator, context):  # type: ignore[no-untyped-def]
        bind_request(context, "Embed", request_id(context))
        with self.calls.counted():
            first = await anext(aiter(request_iterator), None)  # its `model` names the model that embeds
            first = check_decoded(first) if first is not None else None
            async with self._model(first.model if first is not None else "", "model", "embeddings") as engine:
                async for result in EmbedCall(engine).run(_starting_with(first, request_iterator)):
                    yield responses.embed_response(result)

    # -------------------------------------------------------------------- Unary

    @rpc_errors
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:  # type: ignore[no-untyped-def]
        async with self._model(request.model) as engine:
            return await unary.tokenize(engine, request)

    @rpc_errors
    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:  # type: ignore[no-untyped-def]
        async with self._model(request.model) as engine:
            return await unary.detokenize(engine, request)

    @rpc_errors
    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:  # type: ignore[no-untyped-def]
        async with self._model(request.model) as engine:
            return responses.model_info(engine, self.max_queue, self.models.names())

    @rpc_errors
    async def LoadAdapter(self, request: pb.LoadAdapterRequest, context) -> pb.AdapterInfo:  # type: ignore[no-untyped-def]
        return await adapters.load_adapter(self._engine(), request)

    @rpc_errors
    async def UnloadAdapter(self, request: pb.UnloadAdapterRequest, context) -> pb.UnloadAdapterResponse:  # type: ignore[no-untyped-def]
        return await adapters.unload_adapter(self._engine(), request)

    @rpc_errors
    async def ListAdapters(self, request: pb.ListAdaptersRequest, context) -> pb.ListAdaptersResponse:  # type: ignore[no-untyped-def]
        return adapters.list_adapters(self._engine())


def _tools_and_constraint(config: pb.SessionConfig,
                          tool_format: ToolFormat) -> tuple[ToolPlan | None, tuple[str, str] | None]:
    """The session's tools (checked) and the constraint to compile: JSON work that grows with the config."""
    return tool_plan(config, validation.constraint_of(config.constraint), tool_format)


async def _starting_with(first: pb.EmbedRequest | None, rest: AsyncIterator[pb.EmbedRequest]) -> AsyncIterator[pb.EmbedRequest]:
    """The stream again, its first message (read already) first."""
    if first is not None:
        yield first
    async for request in rest:
        yield request

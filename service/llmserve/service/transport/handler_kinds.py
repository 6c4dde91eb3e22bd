"""gRPC method handlers by kind, and re-wrapping one's behaviour (for interceptors).

A `grpc.RpcMethodHandler` keeps its behaviour under an attribute named after its kind
(`unary_unary`, `stream_stream`, ...) and is built by the matching
`grpc.*_rpc_method_handler`; interceptors that time, trace or refuse a call rebuild it
with a new behaviour and the same (de)serializers.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

State = TypeVar("State")

# (request_streaming, response_streaming) -> (grpc_type label, attribute, factory)
_KINDS: dict[tuple[bool, bool], tuple[str, str, Callable[..., grpc.RpcMethodHandler]]] = {
    (False, False): ("unary", "unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("server_stream", "unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("client_stream", "stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("bidi_stream", "stream_stream", grpc.stream_stream_rpc_method_handler),
}


def handler_factory(request_streaming: bool, response_streaming: bool) -> Callable[..., grpc.RpcMethodHandler]:
    return _KINDS[(request_streaming, response_streaming)][2]


def kind_label(handler: grpc.RpcMethodHandler) -> str:
    """go-grpc-prometheus's grpc_type: unary, server_stream, client_stream, bidi_stream."""
    return _KINDS[(handler.request_streaming, handler.response_streaming)][0]


def with_behavior(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """The same method (kind, deserializer, serializer) answered by `behavior`."""
    make = handler_factory(handler.request_streaming, handler.response_streaming)
    return make(behavior, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def observed(
    handler: grpc.RpcMethodHandler,
    begin: Callable[[], State],
    end: Callable[[State, grpc.aio.ServicerContext, BaseException | None], None],
) -> grpc.RpcMethodHandler:
    """The handler with `begin()` run as each call starts and `end(state, context,
    error)` as it ends (error: what the behaviour raised, None when it returned)."""
    behavior = getattr(handler, _KINDS[(handler.request_streaming, handler.response_streaming)][1])

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        state, error = begin(), None
        try:
            return await behavior(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(state, context, error)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        state, error = begin(), None
        try:
            async for response in behavior(request, context):
                yield response
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(state, context, error)

    # A response-streaming behaviour may also be a coroutine that calls context.write.
    return with_behavior(handler, streaming if inspect.isasyncgenfunction(behavior) else unary)

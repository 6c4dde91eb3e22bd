"""Registering LLMService's handlers with request deserializers that never raise.

grpc answers UNKNOWN when a request's bytes do not parse (corrupt wire format,
invalid UTF-8 in a string field). Here a message that does not parse becomes an
`errors.Undecodable` value instead, and `errors.check_decoded` turns it into
INVALID_ARGUMENT at the place the servicer reads it (also inside request streams).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from llmserve.v1 import llmserve_pb2 as pb

from .errors import Undecodable
from .handler_kinds import handler_factory

_SERVICE = pb.DESCRIPTOR.services_by_name["LLMService"]


def _tolerant(cls: Any) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Undecodable(cls.DESCRIPTOR.name, str(exc))

    return deserialize


def add_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    """Like the generated add_LLMServiceServicer_to_server, with tolerant deserializers."""
    handlers = {}
    for method in _SERVICE.methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)
        make = handler_factory(method.client_streaming, method.server_streaming)
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))

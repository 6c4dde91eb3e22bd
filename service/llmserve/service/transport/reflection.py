"""Server reflection under both names clients use: `grpc.reflection.v1` and `v1alpha`.

grpcio-reflection ships only the v1alpha service. The v1 proto is the same messages
under a new package (same fields, same numbers), so one v1alpha servicer answers both:
the v1 method is registered with v1alpha's (de)serializers, and the v1 file (v1alpha's
descriptor with the package renamed) joins the descriptor pool so that reflection can
describe the v1 service too.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    for message in proto.message_type:
        for field in message.field:
            if field.type_name:  # assigning "" would mark a scalar field as typed
                field.type_name = field.type_name.replace(old, new)
    for method in proto.service[0].method:
        method.input_type = method.input_type.replace(old, new)
        method.output_type = method.output_type.replace(old, new)
    pool.AddSerializedFile(proto.SerializeToString())


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    _add_v1_descriptor()
    names = (*service_names, reflection.SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for name in (reflection.SERVICE_NAME, V1_SERVICE_NAME):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler}),))

"""A protoc plugin (for `buf generate`) that runs grpcio-tools' gRPC Python generator.

grpcio-tools compiles its gRPC Python generator into its own protoc; there is no
stand-alone `protoc-gen-grpc_python` of the same version (Debian's grpc_python_plugin
is older and writes different stubs). This plugin hands the request's files to that
protoc through a descriptor set and returns what it wrote, so `buf generate` gives the
same stubs as `make proto` always did.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def generate(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    with tempfile.TemporaryDirectory() as scratch:
        descriptors = Path(scratch) / "request.binpb"
        descriptors.write_bytes(descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString())
        out = Path(scratch) / "out"
        out.mkdir()
        args = ["protoc", f"--descriptor_set_in={descriptors}", f"--grpc_python_out={out}", *request.file_to_generate]
        if protoc.main(args) != 0:
            response.error = "grpc_tools.protoc failed on " + ", ".join(request.file_to_generate)
            return response
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            response.file.add(name=str(path.relative_to(out)), content=path.read_text())
    return response


def main() -> None:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(generate(request).SerializeToString())


if __name__ == "__main__":
    main()

"""llmserve server: gRPC transport, batching executor, KV slot allocator, llama.cpp runner."""

import os

# gRPC's C core logs at INFO to stderr by default (a client's GOAWAY with an error code
# prints "Got goaway [8] ..."): lines that are not JSON in a log of JSON lines. Its
# errors still show; GRPC_VERBOSITY=INFO (or DEBUG) in the environment brings the rest
# back. Set before grpc is imported: the core reads it once, when it initialises.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.1.0"

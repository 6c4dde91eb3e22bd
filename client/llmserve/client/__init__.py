"""Python SDK for llmserve (needs grpcio and protobuf; no llama-cpp-python).

    from llmserve.client import Client
    with Client("127.0.0.1:50051", timeout=30) as client:
        result = client.generate("The capital of France is", max_tokens=16, temperature=0)
        print(result.text, result.turn_end.finish_reason)
        with client.session(max_tokens=32, temperature=0) as chat:
            print(chat.ask([{"role": "user", "content": "Hi!"}]).text)
        vectors = list(client.embed(["hello", "world"]))

`AsyncClient` offers the same with asyncio. Options: `tls`, `root_certificates`,
`client_cert`/`client_key` (mTLS), `api_key`, `timeout`, `wait_for_ready`. Failed
calls raise `LLMServeError` subclasses (also `grpc.RpcError`) carrying the status,
the offending `field` and the server's `retry_after_s`. `client.stub` is the
generated stub; `llmserve.v1.llmserve_pb2` holds the messages.
"""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from .aio import AsyncClient, AsyncSession
from .errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    LLMServeError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from .requests import GenerateResult, make_input, session_config
from .sync import Client, Session

__all__ = [
    "AsyncClient", "AsyncSession", "Cancelled", "Client", "DeadlineExceeded", "FailedPrecondition",
    "GenerateResult", "InvalidArgument", "LLMServeError", "ResourceExhausted", "Session", "Unauthenticated",
    "Unavailable", "make_input", "pb", "session_config",
]

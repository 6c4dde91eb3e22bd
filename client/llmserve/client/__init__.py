"""Python SDK for llmserve (needs grpcio, grpcio-status and protobuf; no llama-cpp-python).

    from llmserve.client import Client
    with Client("127.0.0.1:50051", timeout=30) as client:
        result = client.generate("The capital of France is", max_tokens=16, temperature=0)
        print(result.text, result.turn_end.finish_reason)
        with client.session(max_tokens=32, temperature=0) as chat:
            print(chat.ask([{"role": "user", "content": "Hi!"}], timeout=60).text)
        vectors = list(client.embed(["hello", "world"]))

`AsyncClient` offers the same with asyncio. Connection options (`ConnectionOptions`):
`tls`, `root_certificates`, `client_cert`/`client_key` (mTLS), `server_name`,
`api_key`, `timeout` (each call's default deadline; every call also takes
`timeout=`), `wait_for_ready`, `retries`. Channels use the published service config
(`SERVICE_CONFIG_JSON`: retries on UNAVAILABLE and RESOURCE_EXHAUSTED, wait-for-ready)
and keepalive within the server's limits (see `policy`). `session_config` takes every
SessionConfig field as a keyword. Failed calls raise `LLMServeError` subclasses (also
`grpc.RpcError`) carrying the status, the offending `field` and the server's
`retry_after_s`. `client.stub` is the generated stub; `llmserve.v1.llmserve_pb2`
holds the messages.
"""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from .aio import AsyncClient, AsyncSession
from .connection import ConnectionOptions
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
from .policy import SERVICE_CONFIG, SERVICE_CONFIG_JSON
from .requests import make_input, session_config
from .results import GenerateResult
from .sync import Client, Session

__all__ = [
    "SERVICE_CONFIG", "SERVICE_CONFIG_JSON", "AsyncClient", "AsyncSession", "Cancelled", "Client",
    "ConnectionOptions", "DeadlineExceeded", "FailedPrecondition", "GenerateResult", "InvalidArgument",
    "LLMServeError", "ResourceExhausted", "Session", "Unauthenticated", "Unavailable", "make_input", "pb",
    "session_config",
]

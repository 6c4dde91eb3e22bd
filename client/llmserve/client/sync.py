"""The synchronous client."""

from __future__ import annotations

import copy
import queue
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from .connection import ConnectionOptions, channel_target
from .errors import from_rpc_error
from .requests import GenerateResult, Prompt, collect, embed_requests, from_chunks, make_input, session_config

_END = object()


class Client:
    """One channel to a server. Every failed call raises an `LLMServeError` subclass."""

    def __init__(
        self, target: str | Sequence[str] = "127.0.0.1:50051", *, timeout: float | None = None, **options: Any
    ) -> None:
        """`target`: one address, a DNS name ("dns:///name:port"), or several addresses,
        spread with gRPC's round_robin policy (no proxy needed)."""
        self.options = ConnectionOptions(timeout=timeout, **options)
        creds = self.options.credentials()
        target, channel_options = channel_target(target, self.options)
        self.channel = (
            grpc.secure_channel(target, creds, channel_options) if creds else grpc.insecure_channel(target, channel_options)
        )
        self.stub = pb_grpc.LLMServiceStub(self.channel)
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def with_metadata(self, *pairs: tuple[str, str]) -> Client:
        """This client on the same channel, sending `pairs` as well on every call: e.g.
        `("traceparent", ...)` to make the server's spans children of the caller's span.
        Close the original client, not this view."""
        view = copy.copy(self)
        view.options = replace(self.options, extra_metadata=(*self.options.extra_metadata, *pairs))
        return view

    def close(self) -> None:
        self.channel.close()

    # ---------------------------------------------------------------- generate

    def stream(self, prompt: Prompt, **config: Any) -> Iterator[pb.GenerateResponse]:
        """One-turn Generate: yields every response (chunks, then the turn end)."""
        request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
        try:
            yield from self.stub.Generate(iter([request]), **self.options.call_kwargs())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def generate(self, prompt: Prompt, **config: Any) -> GenerateResult:
        return collect(self.stream(prompt, **config))

    def session(self, **config: Any) -> Session:
        """A multi-turn session on one Generate stream (the KV stays on the server's slot)."""
        return Session(self, session_config(**config))

    # ------------------------------------------------------------------ other

    def embed(self, inputs: Iterable[Prompt], *, normalize: bool = True, truncate: bool = False,
              batch_size: int = 32) -> Iterator[list[float]]:
        """Stream any number of inputs (read lazily); yields one vector per input, in order."""
        requests = embed_requests(inputs, normalize=normalize, truncate=truncate, batch_size=batch_size)
        try:
            for response in self.stub.Embed(requests, **self.options.call_kwargs()):
                yield list(response.embedding)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def _unary(self, method: Any, request: Any) -> Any:
        try:
            return method(request, **self.options.call_kwargs())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True, embedding_model: bool = False
    ) -> list[int]:
        """Token ids; `embedding_model=True`: with the vocabulary Embed uses (ids for Embed's token inputs)."""
        request = pb.TokenizeRequest(
            text=text, add_special=add_special, parse_special=parse_special, embedding_model=embedding_model
        )
        return list(self._unary(self.stub.Tokenize, request).ids)

    def detokenize(self, ids: Sequence[int], *, render_special: bool = False, embedding_model: bool = False) -> str:
        return self._unary(self.stub.Detokenize, pb.DetokenizeRequest(ids=list(ids), render_special=render_special, embedding_model=embedding_model)).text  # type: ignore[no-any-return]

    def model_info(self) -> pb.ModelInfo:
        return self._unary(self.stub.GetModelInfo, pb.GetModelInfoRequest())

    def health(self, service: str = "") -> bool:
        """True when the server reports SERVING (grpc.health.v1; needs no API key)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.options.timeout or 5
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class Session:
    """Turns on one stream: `send()` a turn's input and iterate its chunks; `turn_end`
    holds the last turn's end. `cancel()` stops the running turn; `close()` ends the session."""

    def __init__(self, client: Client, config: pb.SessionConfig) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self._requests.put(pb.GenerateRequest(config=config))
        self._call = client.stub.Generate(self._pending(), **client.options.call_kwargs())
        self._responses = iter(self._call)
        self.turn_end: pb.TurnEnd | None = None

    def _pending(self) -> Iterator[pb.GenerateRequest]:
        while (item := self._requests.get()) is not _END:
            yield item  # type: ignore[misc]

    def send(self, prompt: Prompt) -> Iterator[pb.TokenChunk]:
        self._requests.put(pb.GenerateRequest(input=make_input(prompt), end_of_turn=True))
        try:
            for response in self._responses:
                if response.HasField("chunk"):
                    yield response.chunk
                elif response.HasField("turn_end"):
                    self.turn_end = response.turn_end
                    if response.turn_end.index == 0:
                        return
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def ask(self, prompt: Prompt) -> GenerateResult:
        chunks = list(self.send(prompt))
        return from_chunks(chunks, self.turn_end)

    def cancel(self) -> None:
        self._requests.put(pb.GenerateRequest(cancel=True))

    def close(self) -> None:
        self._requests.put(_END)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

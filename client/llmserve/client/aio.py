"""The asyncio client (grpc.aio)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace
from typing import Any

import grpc
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from .connection import ConnectionOptions, channel_target
from .errors import from_rpc_error
from .requests import GenerateResult, Prompt, collect, embed_requests, from_chunks, make_input, session_config

_END = object()


class AsyncClient:
    """Like `Client`, with coroutines and async iterators."""

    def __init__(
        self, target: str | Sequence[str] = "127.0.0.1:50051", *, timeout: float | None = None, **options: Any
    ) -> None:
        self.options = ConnectionOptions(timeout=timeout, **options)
        creds = self.options.credentials()
        target, channel_options = channel_target(target, self.options)
        self.channel = (
            grpc.aio.secure_channel(target, creds, channel_options)
            if creds else grpc.aio.insecure_channel(target, channel_options)
        )
        self.stub = pb_grpc.LLMServiceStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def with_metadata(self, *pairs: tuple[str, str]) -> AsyncClient:
        """This client on the same channel, sending `pairs` as well on every call: e.g.
        `("traceparent", ...)` to make the server's spans children of the caller's span.
        Close the original client, not this view."""
        view = copy.copy(self)
        view.options = replace(self.options, extra_metadata=(*self.options.extra_metadata, *pairs))
        return view

    async def close(self) -> None:
        await self.channel.close()

    async def stream(self, prompt: Prompt, **config: Any) -> AsyncIterator[pb.GenerateResponse]:
        request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
        try:
            async for response in self.stub.Generate(iter([request]), **self.options.call_kwargs()):
                yield response
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def generate(self, prompt: Prompt, **config: Any) -> GenerateResult:
        return collect([response async for response in self.stream(prompt, **config)])

    def session(self, **config: Any) -> AsyncSession:
        return AsyncSession(self, session_config(**config))

    async def embed(self, inputs: Iterable[Prompt], *, normalize: bool = True, truncate: bool = False,
                    batch_size: int = 32) -> AsyncIterator[list[float]]:
        requests = embed_requests(inputs, normalize=normalize, truncate=truncate, batch_size=batch_size)
        try:
            async for response in self.stub.Embed(requests, **self.options.call_kwargs()):
                yield list(response.embedding)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, **self.options.call_kwargs())
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True, embedding_model: bool = False
    ) -> list[int]:
        """Token ids; `embedding_model=True`: with the vocabulary Embed uses (ids for Embed's token inputs)."""
        request = pb.TokenizeRequest(
            text=text, add_special=add_special, parse_special=parse_special, embedding_model=embedding_model
        )
        return list((await self._unary(self.stub.Tokenize, request)).ids)

    async def detokenize(self, ids: Sequence[int], *, render_special: bool = False, embedding_model: bool = False) -> str:
        reply = await self._unary(self.stub.Detokenize, pb.DetokenizeRequest(ids=list(ids), render_special=render_special, embedding_model=embedding_model))
        return reply.text  # type: ignore[no-any-return]

    async def model_info(self) -> pb.ModelInfo:
        return await self._unary(self.stub.GetModelInfo, pb.GetModelInfoRequest())

    async def health(self, service: str = "") -> bool:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            reply = await health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.options.timeout or 5
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class AsyncSession:
    """Turns on one stream (see `Session`)."""

    def __init__(self, client: AsyncClient, config: pb.SessionConfig) -> None:
        self._requests: asyncio.Queue[object] = asyncio.Queue()
        self._requests.put_nowait(pb.GenerateRequest(config=config))
        self._call = client.stub.Generate(self._pending(), **client.options.call_kwargs())
        self.turn_end: pb.TurnEnd | None = None

    async def _pending(self) -> AsyncIterator[pb.GenerateRequest]:
        while (item := await self._requests.get()) is not _END:
            yield item  # type: ignore[misc]

    async def send(self, prompt: Prompt) -> AsyncIterator[pb.TokenChunk]:
        await self._requests.put(pb.GenerateRequest(input=make_input(prompt), end_of_turn=True))
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    return
                if response.HasField("chunk"):
                    yield response.chunk
                elif response.HasField("turn_end"):
                    self.turn_end = response.turn_end
                    if response.turn_end.index == 0:
                        return
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def ask(self, prompt: Prompt) -> GenerateResult:
        chunks = [c async for c in self.send(prompt)]
        return from_chunks(chunks, self.turn_end)

    async def cancel(self) -> None:
        await self._requests.put(pb.GenerateRequest(cancel=True))

    async def close(self) -> None:
        await self._requests.put(_END)
        try:
            while await self._call.read() is not grpc.aio.EOF:
                pass
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

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

from .connection import ConnectionOptions, Target, open_channel
from .errors import from_rpc_error
from .requests import Prompt, embed_requests, make_input, session_config
from .resets import ResetRetry, retried_async
from .results import GenerateResult, collect
from .turns import CANCEL_GRACE_S, TurnTracker

_END = object()


class AsyncClient:
    """Like `Client`, with coroutines and async iterators; every call takes `timeout=`."""

    def __init__(self, target: Target = "127.0.0.1:50051", *, timeout: float | None = None, **options: Any) -> None:
        self.options = ConnectionOptions(timeout=timeout, **options)
        self.channel = open_channel(target, self.options, aio=True)
        self.stub = pb_grpc.LLMServiceStub(self.channel)
        self.timeout = timeout

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

    async def stream(self, prompt: Prompt, *, timeout: float | None = None,
                     **config: Any) -> AsyncIterator[pb.GenerateResponse]:
        request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
        kwargs = self.options.call_kwargs(timeout, request.config, request.input)
        retry = ResetRetry(self.options.retries, kwargs["timeout"])  # see `resets`
        try:
            async for response in retried_async(
                    lambda t: self.stub.Generate(iter([request]), **{**kwargs, "timeout": t}), retry):
                yield response
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def generate(self, prompt: Prompt, *, timeout: float | None = None, **config: Any) -> GenerateResult:
        return collect([response async for response in self.stream(prompt, timeout=timeout, **config)])

    def session(self, *, timeout: float | None = None, **config: Any) -> AsyncSession:
        """See `Client.session`; also an async context manager."""
        return AsyncSession(self, session_config(**config), timeout)

    async def embed(self, inputs: Iterable[Prompt], *, normalize: bool = True, truncate: bool = False,
                    batch_size: int = 32, timeout: float | None = None, model: str = "") -> AsyncIterator[list[float]]:
        requests = embed_requests(inputs, normalize=normalize, truncate=truncate, batch_size=batch_size, model=model)
        try:
            async for response in self.stub.Embed(requests, **self.options.call_kwargs(timeout, pb.SessionConfig(model=model))):
                yield list(response.embedding)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def _unary(self, method: Any, request: Any, timeout: float | None) -> Any:
        kwargs = self.options.call_kwargs(timeout)

        async def attempt(t: float | None) -> AsyncIterator[Any]:
            yield await method(request, **{**kwargs, "timeout": t})

        try:
            [response] = [r async for r in retried_async(attempt, ResetRetry(self.options.retries, kwargs["timeout"]))]
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        return response

    async def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                       embedding_model: bool = False, timeout: float | None = None) -> list[int]:
        """Token ids; `embedding_model=True`: with the vocabulary Embed uses (ids for Embed's token inputs)."""
        request = pb.TokenizeRequest(
            text=text, add_special=add_special, parse_special=parse_special, embedding_model=embedding_model
        )
        return list((await self._unary(self.stub.Tokenize, request, timeout)).ids)

    async def detokenize(self, ids: Sequence[int], *, render_special: bool = False, embedding_model: bool = False,
                         timeout: float | None = None) -> str:
        request = pb.DetokenizeRequest(ids=list(ids), render_special=render_special, embedding_model=embedding_model)
        return (await self._unary(self.stub.Detokenize, request, timeout)).text  # type: ignore[no-any-return]

    async def model_info(self, model: str = "", *, timeout: float | None = None) -> pb.ModelInfo:
        """The model's facts and slots: the default model's, or the further model `model` names."""
        return await self._unary(self.stub.GetModelInfo, pb.GetModelInfoRequest(model=model), timeout)

    async def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            reply = await health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout or self.options.timeout or 5.0
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class AsyncSession:
    """Turns on one stream (see `Session`); `async with` closes it, or cancels the
    stream when the block raised."""

    def __init__(self, client: AsyncClient, config: pb.SessionConfig, timeout: float | None = None) -> None:
        self._requests: asyncio.Queue[object] = asyncio.Queue()
        # The config rides with the first turn's input, in one message: if the server refuses
        # the config, the client has nothing more to write. (grpc aio reports a write after
        # the server ended the call as INTERNAL "Internal error from Core", hiding the
        # server's status: grpc/grpc#36066.)
        self._config: pb.SessionConfig | None = config
        self._call = client.stub.Generate(self._pending(), **client.options.call_kwargs(timeout, config))
        self._samples = config.n if config.HasField("n") else 1
        self.turn_end: pb.TurnEnd | None = None
        self.turn_ends: tuple[pb.TurnEnd, ...] = ()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # do not wait for a turn nobody will read
            self._call.cancel()
            return
        await self.close()

    async def _pending(self) -> AsyncIterator[pb.GenerateRequest]:
        while (item := await self._requests.get()) is not _END:
            yield item  # type: ignore[misc]

    async def responses(self, prompt: Prompt, *, timeout: float | None = None) -> AsyncIterator[pb.GenerateResponse]:
        """See `Session.responses`."""
        await self._requests.put(self._with_config(pb.GenerateRequest(input=make_input(prompt), end_of_turn=True)))
        tracker = TurnTracker(self._samples, timeout)
        loop = asyncio.get_running_loop()
        handles = [loop.call_later(timeout, tracker.expire, self._cancel_now),
                   loop.call_later(timeout + CANCEL_GRACE_S, self._call.cancel)] if timeout else []
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                yield response
                if tracker.ended(response):
                    break
        except grpc.RpcError as err:
            raise tracker.error(err) from None
        finally:
            for handle in handles:
                handle.cancel()
            self.turn_end, self.turn_ends = tracker.turn_end or self.turn_end, tuple(tracker.ends)
        if tracker.timed_out():
            raise tracker.error(None)

    async def send(self, prompt: Prompt, *, timeout: float | None = None) -> AsyncIterator[pb.TokenChunk]:
        async for response in self.responses(prompt, timeout=timeout):
            if response.HasField("chunk"):
                yield response.chunk

    async def ask(self, prompt: Prompt, *, timeout: float | None = None) -> GenerateResult:
        return collect([response async for response in self.responses(prompt, timeout=timeout)])

    def _cancel_now(self) -> None:
        self._requests.put_nowait(pb.GenerateRequest(cancel=True))

    async def cancel(self) -> None:
        self._cancel_now()

    def _with_config(self, request: pb.GenerateRequest) -> pb.GenerateRequest:
        if self._config is not None:
            request.config.CopyFrom(self._config)
            self._config = None
        return request

    async def close(self) -> None:
        if self._config is not None:  # no turn was sent: the stream still opens, as it always did
            await self._requests.put(self._with_config(pb.GenerateRequest()))
        await self._requests.put(_END)
        try:
            while await self._call.read() is not grpc.aio.EOF:
                pass
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

"""The synchronous client."""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from .connection import ConnectionOptions, Target, open_channel
from .errors import from_rpc_error
from .requests import Prompt, embed_requests, make_input, session_config
from .resets import ResetRetry, retried
from .results import GenerateResult, collect
from .turns import CANCEL_GRACE_S, TurnTracker

_END = object()


class Client:
    """One channel to a server. Every failed call raises an `LLMServeError` subclass.
    Every call takes `timeout=` (seconds), its deadline in place of the client's."""

    def __init__(self, target: Target = "127.0.0.1:50051", *, timeout: float | None = None, **options: Any) -> None:
        """`target`: one address ("host:port"), any gRPC target ("dns:///name:port",
        balanced with round_robin), or a list of host:port addresses (host names are
        resolved once; round_robin over all of them). `timeout`: the default deadline
        of each call in seconds. `options`: the `ConnectionOptions` fields (tls,
        root_certificates, client_cert, client_key, server_name, api_key,
        wait_for_ready, retries, options, extra_metadata, affinity_key, derive_affinity)."""
        self.options = ConnectionOptions(timeout=timeout, **options)
        self.channel = open_channel(target, self.options)
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

    def stream(self, prompt: Prompt, *, timeout: float | None = None, **config: Any) -> Iterator[pb.GenerateResponse]:
        """One-turn Generate: yields every response (chunks, then the turn end; with
        n > 1 each sample's, told apart by `index`). `config`: see `session_config`."""
        request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
        kwargs = self.options.call_kwargs(timeout, request.config, request.input)
        try:
            yield from retried(lambda t: self.stub.Generate(iter([request]), **{**kwargs, "timeout": t}),
                               self._reset_retry(kwargs))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def generate(self, prompt: Prompt, *, timeout: float | None = None, **config: Any) -> GenerateResult:
        return collect(self.stream(prompt, timeout=timeout, **config))

    def stream_once(self, prompt: Prompt, *, timeout: float | None = None, **config: Any) -> Iterator[pb.GenerateOnceResponse]:
        """`stream` over the one-shot server-streaming GenerateOnce RPC (no bidi stream)."""
        request = pb.GenerateOnceRequest(config=session_config(**config), input=make_input(prompt))
        kwargs = self.options.call_kwargs(timeout, request.config, request.input)
        try:
            yield from retried(lambda t: self.stub.GenerateOnce(request, **{**kwargs, "timeout": t}),
                               self._reset_retry(kwargs))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def generate_text(self, prompt: Prompt, *, timeout: float | None = None, **config: Any) -> pb.GenerateTextResponse:
        """One turn over the unary GenerateText RPC: each sample's whole text and turn end."""
        request = pb.GenerateTextRequest(config=session_config(**config), input=make_input(prompt))
        return self._unary(self.stub.GenerateText, request, timeout, request.config, request.input)

    def session(self, *, timeout: float | None = None, **config: Any) -> Session:
        """A multi-turn session on one Generate stream (the KV stays on the server's slot).
        `timeout` is the deadline of the whole stream; each turn may have its own
        (`Session.send(..., timeout=)`). `config`: see `session_config`."""
        return Session(self, session_config(**config), timeout)

    # ------------------------------------------------------------------ other

    def embed(self, inputs: Iterable[Prompt], *, normalize: bool = True, truncate: bool = False,
              batch_size: int = 32, timeout: float | None = None, model: str = "") -> Iterator[list[float]]:
        """Stream any number of inputs (read lazily); yields one vector per input, in order.
        `model`: a further embedding model (`-m NAME=PATH`) instead of the default model's embeddings."""
        requests = embed_requests(inputs, normalize=normalize, truncate=truncate, batch_size=batch_size, model=model)
        try:
            for response in self.stub.Embed(requests, **self.options.call_kwargs(timeout, pb.SessionConfig(model=model))):
                yield list(response.embedding)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def _reset_retry(self, kwargs: dict[str, Any]) -> ResetRetry:
        """A one-shot call cut by a proxy before its first response is made again (`resets`)."""
        return ResetRetry(self.options.retries, kwargs["timeout"])

    def _unary(self, method: Any, request: Any, timeout: float | None, config: pb.SessionConfig | None = None,
               head: pb.Input | None = None) -> Any:
        kwargs = self.options.call_kwargs(timeout, config, head)
        try:
            return next(retried(lambda t: [method(request, **{**kwargs, "timeout": t})], self._reset_retry(kwargs)))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 embedding_model: bool = False, timeout: float | None = None) -> list[int]:
        """Token ids; `embedding_model=True`: with the vocabulary Embed uses (ids for Embed's token inputs)."""
        request = pb.TokenizeRequest(
            text=text, add_special=add_special, parse_special=parse_special, embedding_model=embedding_model
        )
        return list(self._unary(self.stub.Tokenize, request, timeout).ids)

    def detokenize(self, ids: Sequence[int], *, render_special: bool = False, embedding_model: bool = False,
                   timeout: float | None = None) -> str:
        request = pb.DetokenizeRequest(ids=list(ids), render_special=render_special, embedding_model=embedding_model)
        return self._unary(self.stub.Detokenize, request, timeout).text  # type: ignore[no-any-return]

    def model_info(self, model: str = "", *, timeout: float | None = None) -> pb.ModelInfo:
        """The model's facts and slots: the default model's, or the further model `model` names."""
        return self._unary(self.stub.GetModelInfo, pb.GetModelInfoRequest(model=model), timeout)

    def health(self, service: str = "", *, timeout: float | None = None) -> bool:
        """True when the server reports SERVING (grpc.health.v1; needs no API key; fails
        fast rather than waiting for the server: no wait-for-ready, no retries)."""
        return self.health_status(service, timeout=timeout) == "SERVING"

    def health_status(self, service: str = "", *, timeout: float | None = None) -> str:
        """The serving status's name (SERVING, NOT_SERVING, ...), or the failed call's code's."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        request = health_pb2.HealthCheckRequest(service=service)
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                request, timeout=timeout or self.options.timeout or 5.0
            )
        except grpc.RpcError as err:
            return err.code().name  # type: ignore[attr-defined,no-any-return]
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class Session:
    """Turns on one stream: `send()` a turn's input and iterate its chunks; `turn_end`
    holds the last turn's end (sample 0's; `turn_ends` has every sample's). `cancel()`
    stops the running turn; `close()` ends the session. A `with` block closes it, or
    cancels the stream when the block raised."""

    def __init__(self, client: Client, config: pb.SessionConfig, timeout: float | None = None) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self._requests.put(pb.GenerateRequest(config=config))
        self._call = client.stub.Generate(self._pending(), **client.options.call_kwargs(timeout, config))
        self._responses = iter(self._call)
        self._samples = config.n if config.HasField("n") else 1
        self.turn_end: pb.TurnEnd | None = None
        self.turn_ends: tuple[pb.TurnEnd, ...] = ()

    def _pending(self) -> Iterator[pb.GenerateRequest]:
        while (item := self._requests.get()) is not _END:
            yield item  # type: ignore[misc]

    def responses(self, prompt: Prompt, *, timeout: float | None = None) -> Iterator[pb.GenerateResponse]:
        """Send one turn's input; yield its responses up to the last sample's turn end.
        `timeout`: the turn's time limit in seconds. Past it the turn is cancelled in
        band and DeadlineExceeded raised once it has ended; the session goes on."""
        self._requests.put(pb.GenerateRequest(input=make_input(prompt), end_of_turn=True))
        tracker = TurnTracker(self._samples, timeout)
        timers = [threading.Timer(timeout, tracker.expire, [self.cancel]),
                  threading.Timer(timeout + CANCEL_GRACE_S, self._call.cancel)] if timeout else []
        for timer in timers:
            timer.daemon = True
            timer.start()
        try:
            for response in self._responses:
                yield response
                if tracker.ended(response):
                    break
        except grpc.RpcError as err:
            raise tracker.error(err) from None
        finally:
            for timer in timers:
                timer.cancel()
            self.turn_end, self.turn_ends = tracker.turn_end or self.turn_end, tuple(tracker.ends)
        if tracker.timed_out():
            raise tracker.error(None)

    def send(self, prompt: Prompt, *, timeout: float | None = None) -> Iterator[pb.TokenChunk]:
        """Send one turn's input; yield its chunks (every sample's when n > 1)."""
        for response in self.responses(prompt, timeout=timeout):
            if response.HasField("chunk"):
                yield response.chunk

    def ask(self, prompt: Prompt, *, timeout: float | None = None) -> GenerateResult:
        return collect(self.responses(prompt, timeout=timeout))

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

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # do not wait for a turn nobody will read
            self._call.cancel()
            self._requests.put(_END)
            return
        self.close()

"""Python client for llmserve (needs only grpcio and protobuf).

    from llmserve.client import Client
    with Client("127.0.0.1:50051") as client:
        result = client.generate("The capital of France is", max_tokens=16, temperature=0)
        print(result.text, result.turn_end.finish_reason)
        vectors = client.embed(["hello", "world"])

For anything the helpers do not cover, `client.stub` is the generated
`LLMServiceStub` and `llmserve.v1.llmserve_pb2` holds the messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc
from llmserve.v1 import llmserve_pb2 as pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

__all__ = ["Client", "GenerateResult", "pb", "make_input", "session_config"]


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: tuple[int, ...]
    turn_end: pb.TurnEnd


def make_input(prompt: str | Sequence[int]) -> pb.Input:
    if isinstance(prompt, str):
        return pb.Input(text=prompt)
    return pb.Input(tokens=pb.TokenIds(ids=list(prompt)))


def session_config(
    *,
    request_id: str = "",
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    priority: int = 0,
    session_id: str = "",
    **sampling: float | int,
) -> pb.SessionConfig:
    """Build a SessionConfig; `sampling` takes SamplingParams field names (temperature=0, seed=1, ...)."""
    stopping = pb.StoppingCriteria(stop=list(stop), ignore_eos=ignore_eos)
    if max_tokens is not None:
        stopping.max_tokens = max_tokens
    return pb.SessionConfig(
        request_id=request_id,
        priority=priority,
        session_id=session_id,
        sampling=pb.SamplingParams(**{k: v for k, v in sampling.items() if v is not None}),
        stopping=stopping,
    )


class Client:
    """Synchronous client over one channel."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: float | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.LLMServiceStub(self.channel)
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def stream(self, prompt: str | Sequence[int], **config: float | int | str | Sequence[str] | None) -> Iterator[pb.GenerateResponse]:
        """One-turn Generate: yields every response (chunks, then the turn end)."""
        request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)  # type: ignore[arg-type]
        return self.stub.Generate(iter([request]), timeout=self.timeout)

    def generate(self, prompt: str | Sequence[int], **config: float | int | str | Sequence[str] | None) -> GenerateResult:
        text: list[str] = []
        ids: list[int] = []
        turn_end = pb.TurnEnd()
        for response in self.stream(prompt, **config):
            if response.HasField("chunk"):
                text.append(response.chunk.text)
                ids.extend(response.chunk.token_ids)
            else:
                turn_end = response.turn_end
        return GenerateResult("".join(text), tuple(ids), turn_end)

    def embed(
        self,
        inputs: Iterable[str | Sequence[int]],
        *,
        normalize: bool = True,
        truncate: bool = False,
        batch_size: int = 32,
    ) -> Iterator[list[float]]:
        """Stream any number of inputs; yields one vector per input, in order."""

        def requests() -> Iterator[pb.EmbedRequest]:
            options = pb.EmbedOptions(normalize=normalize, truncate=truncate)
            chunk: list[pb.Input] = []
            for item in inputs:
                chunk.append(make_input(item))
                if len(chunk) == batch_size:
                    yield pb.EmbedRequest(options=options, inputs=chunk)
                    chunk = []
            if chunk:
                yield pb.EmbedRequest(options=options, inputs=chunk)

        for response in self.stub.Embed(requests(), timeout=self.timeout):
            yield list(response.embedding)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        request = pb.TokenizeRequest(text=text, add_special=add_special, parse_special=parse_special)
        return list(self.stub.Tokenize(request, timeout=self.timeout).ids)

    def detokenize(self, ids: Sequence[int], *, render_special: bool = False) -> str:
        request = pb.DetokenizeRequest(ids=list(ids), render_special=render_special)
        return self.stub.Detokenize(request, timeout=self.timeout).text

    def model_info(self) -> pb.ModelInfo:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self.timeout)

"""Building request messages: inputs (text, token ids, chat messages) and session configs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from llmserve.v1 import llmserve_pb2 as pb

Prompt = Union[str, Sequence[int], Sequence[Mapping[str, str]], pb.Input]


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: tuple[int, ...]
    turn_end: pb.TurnEnd


def collect(responses: Iterable[pb.GenerateResponse]) -> GenerateResult:
    """One turn's responses (chunks, then the turn end) as a GenerateResult."""
    chunks: list[pb.TokenChunk] = []
    turn_end = pb.TurnEnd()
    for response in responses:
        if response.HasField("chunk"):
            chunks.append(response.chunk)
        elif response.HasField("turn_end"):
            turn_end = response.turn_end
    return from_chunks(chunks, turn_end)


def from_chunks(chunks: Iterable[pb.TokenChunk], turn_end: pb.TurnEnd | None) -> GenerateResult:
    chunks = list(chunks)
    ids = tuple(t for c in chunks for t in c.token_ids)
    return GenerateResult("".join(c.text for c in chunks), ids, turn_end or pb.TurnEnd())


def make_input(prompt: Prompt) -> pb.Input:
    """Text, token ids, or chat messages ([{"role": ..., "content": ...}, ...])."""
    if isinstance(prompt, pb.Input):
        return prompt
    if isinstance(prompt, str):
        return pb.Input(text=prompt)
    items = list(prompt)
    if items and isinstance(items[0], Mapping):
        messages = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in items]  # type: ignore[index]
        return pb.Input(messages=pb.ChatMessages(messages=messages))
    return pb.Input(tokens=pb.TokenIds(ids=list(items)))  # type: ignore[arg-type]


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
    """A SessionConfig; `sampling` takes SamplingParams field names (temperature=0, seed=1, ...)."""
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


def embed_requests(inputs, *, normalize: bool, truncate: bool, batch_size: int):  # type: ignore[no-untyped-def]
    """Lazily batch any iterable of inputs into EmbedRequests (gRPC flow control paces it)."""
    options = pb.EmbedOptions(normalize=normalize, truncate=truncate)
    chunk: list[pb.Input] = []
    first = True
    for item in inputs:
        chunk.append(make_input(item))
        if len(chunk) == batch_size:
            yield pb.EmbedRequest(options=options if first else None, inputs=chunk)
            chunk, first = [], False
    if chunk or first:
        yield pb.EmbedRequest(options=options if first else None, inputs=chunk)

"""One turn's responses gathered into a result (several samples when n > 1)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from llmserve.v1 import llmserve_pb2 as pb


@dataclass(frozen=True)
class GenerateResult:
    """A finished turn. `text`, `token_ids`, `logprobs` and `turn_end` are sample 0's;
    `samples` holds every sample in index order (one unless the session asked for n > 1).
    `logprobs`: one per token when the config set `top_logprobs`/`logprobs`;
    `prompt_logprobs`: the prompt tokens' when it set `prompt_logprobs`."""

    text: str
    token_ids: tuple[int, ...]
    turn_end: pb.TurnEnd
    logprobs: tuple[pb.TokenLogprob, ...] = ()
    prompt_logprobs: tuple[pb.TokenLogprob, ...] = ()
    samples: tuple[GenerateResult, ...] = ()


def collect(responses: Iterable[pb.GenerateResponse]) -> GenerateResult:
    """One turn's responses (chunks, prompt logprobs, turn ends) as a GenerateResult."""
    chunks: dict[int, list[pb.TokenChunk]] = {}
    ends: dict[int, pb.TurnEnd] = {}
    prompt: list[pb.TokenLogprob] = []
    for response in responses:
        kind = response.WhichOneof("event")
        if kind == "chunk":
            chunks.setdefault(response.chunk.index, []).append(response.chunk)
        elif kind == "turn_end":
            ends[response.turn_end.index] = response.turn_end
        elif kind == "prompt_logprobs":
            prompt.extend(response.prompt_logprobs.tokens)
    samples = tuple(
        GenerateResult(
            text="".join(c.text for c in chunks.get(i, [])),
            token_ids=tuple(t for c in chunks.get(i, []) for t in c.token_ids),
            turn_end=ends.get(i, pb.TurnEnd(index=i)),
            logprobs=tuple(lp for c in chunks.get(i, []) for lp in c.logprobs),
            prompt_logprobs=tuple(prompt),
        )
        for i in sorted(set(chunks) | set(ends) | {0})
    )
    return replace(samples[0], samples=samples)

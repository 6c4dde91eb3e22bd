"""Prompt logprobs: each prompt token scored with the logits of the row before it."""

from __future__ import annotations

from ..domain.events import PromptLogprobsEvent, TokenLogprob
from .logprobs import log_softmax, token_logprob
from .runner_api import Runner
from .sample import Sample


def score_prompt_chunk(runner: Runner, s: Sample, tokens: list[int], first: int, num_seen: int = 0) -> None:
    """Score the chunk that entered the KV in batch rows `first`..; the first `num_seen`
    were scored when they first entered the KV (this is a recompute of them). The last
    row is kept on the sample to score the next chunk's first token."""
    scored: list[TokenLogprob] = []
    previous = s.prompt_logits
    top_n = s.params.output.top_logprobs or 0

    def text(token: int) -> str:
        return runner.piece(token, True).decode("utf-8", "replace")

    for j, token in enumerate(tokens):
        if previous is not None and j >= num_seen:
            scored.append(token_logprob(log_softmax(previous), token, top_n, text))
        previous = runner.logits_row(first + j)
    s.prompt_logits = previous.copy() if previous is not None else None
    if scored:
        s.sink.put(PromptLogprobsEvent(tuple(scored)))

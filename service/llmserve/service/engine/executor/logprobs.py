"""Logprobs from rows of raw logits (numpy), only computed when a request asks: a picked
token's (with its most likely alternatives), and a prompt's, each prompt token scored with
the logits of the row before it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...domain.events import PromptLogprobsEvent, TokenLogprob
from ..runner_api import Runner
from .sample import Sample


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(logits.max())
    return shifted - np.log(np.exp(shifted).sum())


def token_logprob(lp: np.ndarray, token: int, top_n: int, text_of: Callable[[int], str]) -> TokenLogprob:
    """From a row of logprobs: the token's and the `top_n` most likely (sorted, most likely first)."""
    top: tuple[tuple[int, str, float], ...] = ()
    if top_n > 0:
        ids = np.argpartition(-lp, top_n)[:top_n]
        ids = ids[np.argsort(-lp[ids], kind="stable")]
        top = tuple((int(i), text_of(int(i)), float(lp[i])) for i in ids)
    return TokenLogprob(token_id=token, logprob=float(lp[token]), top=top)


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
    s.keep_prompt_logits(previous.copy() if previous is not None else None)
    if scored:
        s.sink.put(PromptLogprobsEvent(tuple(scored)))

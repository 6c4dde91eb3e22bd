"""Logprobs from a row of raw logits (numpy): only computed when a request asks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..domain.events import TokenLogprob


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

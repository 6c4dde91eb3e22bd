"""One embedding step: queued inputs packed into one ubatch on the runner's embedding
context, each result (normalized when asked) to its call's sink. Executor thread only."""

from __future__ import annotations

import time

import numpy as np
import structlog

from ...domain.errors import FailureKind
from ...domain.events import EmbedResult, EventSink, SessionFailed
from ...domain.requests import EmbedInput
from ...metrics import Metrics
from ..runner_api import Runner

log = structlog.get_logger("llmserve.executor")


def run_embeddings(runner: Runner, items: list[tuple[EmbedInput, EventSink]], metrics: Metrics) -> None:
    t_start = time.monotonic()
    try:
        vectors = runner.embed([item.tokens for item, _ in items])
    except Exception as exc:  # noqa: BLE001 - those inputs fail, the loop goes on
        log.error("embedding_step_failed", error=str(exc))
        for _, sink in items:
            sink.put(SessionFailed(FailureKind.INTERNAL, str(exc)))
        return
    t_end = time.monotonic()
    for (item, sink), vector in zip(items, vectors):
        if item.normalize:
            norm = float(np.linalg.norm(vector))
            if norm > 0.0:
                vector /= norm
        sink.put(EmbedResult(item.index, vector, len(item.tokens), item.truncated, t_start, t_end, len(items)))
    metrics.embeddings.inc(len(items))
    metrics.embedding_tokens.inc(sum(len(item.tokens) for item, _ in items))

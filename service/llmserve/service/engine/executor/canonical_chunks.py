"""Deterministic decoding: what a deterministic sample computes, and what of the cache it reuses.

llama.cpp's numbers depend on a decode's shape: how many rows it has, how they split into
ubatches, which kernels that picks (docs/benchmarks.md). A sample in deterministic mode
(`SamplingParams.deterministic`, `--deterministic`) therefore computes its KV in one shape
only: its transcript in *canonical chunks* of `chunk` tokens from position 0 (the last one
partial), then one token per decode, each decode holding this sample's rows and no one
else's (`StepRotation`). It reuses cached KV only as far as it was computed that way, in
whole chunks (`Slot.num_canonical`), and never the whole input: the chunk with the input's
last token is computed again for its logits. A deterministic turn's output is so a function
of its transcript alone: the same bits alone or beside 15 other sessions, on a warm or a
cold cache, as turn N of a session or as a fresh request with the same transcript.
"""

from __future__ import annotations

MAX_CANONICAL_CHUNK = 256  # a chunk runs alone, so it is what the other sessions wait for


def canonical_chunk(n_batch: int, n_ubatch: int) -> int:
    """The server's chunk: one ubatch, within one step."""
    return min(MAX_CANONICAL_CHUNK, n_batch, n_ubatch)


def is_canonical(num_canonical: int, position: int, num_tokens: int, chunk: int) -> bool:
    """Whether `num_tokens` computed alone at `position` extend a canonical prefix of `num_canonical`."""
    return num_tokens == chunk and position == num_canonical and position % chunk == 0


def num_ready(position: int, num_pending: int, chunk: int, input_ended: bool) -> int:
    """Of `num_pending` tokens ready at `position`, how many go in the next chunk: up to the
    next boundary; while more input may come, a whole chunk or nothing."""
    to_boundary = chunk - position % chunk
    if num_pending >= to_boundary:
        return to_boundary
    return num_pending if input_ended else 0


def rewind_point(num_canonical: int, chunk: int) -> int:
    """Where a deterministic sample's history is computed again from: the end of its last whole chunk."""
    return num_canonical // chunk * chunk


def reusable(num_canonical: int, num_confirmed: int, num_shared: int, chunk: int) -> int:
    """Of `num_shared` cached tokens that follow `num_confirmed` confirmed ones, how many a
    deterministic sample takes: up to the end of the last whole canonical chunk among them."""
    return max(0, rewind_point(min(num_canonical, num_confirmed + num_shared), chunk) - num_confirmed)

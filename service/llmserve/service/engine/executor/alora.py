"""Activated LoRA (aLoRA): an adapter that applies only from its invocation on (executor thread only).

An aLoRA file names an invocation token sequence (llama.cpp's `adapter.alora.invocation_tokens`).
A session under one computes the tokens before the start of the invocation's last
occurrence in its context under the base model and the rest (the
invocation, what follows, the reply) under the adapter; when no invocation occurs the
whole turn runs on the base. The point is found when a turn's input ends (`invocation_start`,
recorded by `Sample.begin_turn`); until then nothing of the turn is prefilled, and no
prompt chunk crosses the point (`prefill_ready`), so each decode still runs one adapter set.

The base's KV before the point is shared both ways: an aLoRA session's slot is keyed as the
base's and reuses a prefix cached there up to its own point (`reusable_head`), and the slot
marks where its aLoRA cells begin (`adapter_cells`, `Slot.base_until`) so that no later
session reuses those. PEFT's aLoRA applies the adapter from the invocation's first token, as
here; llama-server from the token before it (docs/adapters.md, "Activated LoRA").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...domain.requests import AdapterSet, SessionParams
from .allocator import Slot


class AloraSample(Protocol):
    """What these rules read of a `Sample` (sample.py, which imports this module)."""

    params: SessionParams
    slot: Slot | None
    alora_from: int | None
    turn: object | None
    pending: list[int]

    @property
    def generating(self) -> bool: ...


def invocation_start(slot: Slot | None, pending: Sequence[int], invocation: Sequence[int]) -> int | None:
    """Where the last occurrence of `invocation` starts in a sample's context, its history in
    the KV (`slot`) and its pending input (None: nowhere)."""
    if not invocation:  # not an aLoRA
        return None
    context = np.asarray([*(slot.tokens[: slot.num_confirmed] if slot is not None else ()), *pending], dtype=np.int64)
    num_starts = len(context) - len(invocation) + 1
    if num_starts <= 0:
        return None
    matches = np.ones(num_starts, dtype=bool)  # vectorized: a long context sent by a client stalls no step
    for i, token in enumerate(invocation):
        matches &= context[i : i + num_starts] == token
    found = np.flatnonzero(matches)
    return int(found[-1]) if found.size else None


def adapters_now(s: AloraSample) -> AdapterSet:
    """The set a sample's next rows run under: its adapters, or for an aLoRA the adapter's from
    `alora_from` on (and while generating after it), the base's before it or when the
    invocation never came."""
    if not s.params.alora_invocation:
        return s.params.adapters
    position = s.slot.num_confirmed if s.slot is not None else 0
    on = s.alora_from is not None and (s.generating or position >= s.alora_from)
    return s.params.adapters if on else ()


def reusable_head(s: AloraSample) -> Sequence[int]:
    """The head of a fresh sample's pending input a cached prefix may cover: all of it, or for
    an aLoRA what comes before its invocation ([] while its input has not ended)."""
    if not s.params.alora_invocation:
        return s.pending
    if s.turn is None:
        return []
    return s.pending if s.alora_from is None else s.pending[: s.alora_from]


def adapter_cells(s: AloraSample) -> bool:
    """Whether the rows its next KV cells come from ran under an aLoRA (the slot marks them:
    `Slot.base_until`, past which its KV is no prefix for another session)."""
    return bool(s.params.alora_invocation) and adapters_now(s) != ()


def prefill_ready(s: AloraSample, ready: int) -> int:
    """Of a sample's `ready` prompt tokens, those that may go into the next chunk: for an aLoRA,
    none before the turn's input ended (its point is not known yet), none across `alora_from`."""
    if not s.params.alora_invocation:
        return ready
    if s.turn is None or s.slot is None:
        return 0
    start, position = s.alora_from, s.slot.num_confirmed
    return min(ready, start - position) if start is not None and position < start else ready

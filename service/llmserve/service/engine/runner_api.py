"""What the engine needs from a model runner: the `Runner` protocol, and its cost model.

`model.runner.LlamaRunner` implements it over llama.cpp; the unit tests implement
it with deterministic logits and no llama_cpp (tests/unit/engine/fake_runner.py), so the
session table, the step, stop handling, multi-turn, cancel and n > 1 run on the
CPU in milliseconds. What a step costs is the runner's knowledge too (`StepCosts`: the
backend's kernels, the model's size): the scheduler prices drafts by it, the step counts
ubatches by it. Executor thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..domain.model_meta import ModelMeta
from ..domain.requests import AdapterSet, SamplingParams


class TokenSampler(Protocol):
    """One sequence's sampler chain (and grammar)."""

    def sample(self, row: int, logits: np.ndarray) -> int | None:
        """Sample from batch row `row` of the last decode (`logits` is its view) and accept
        the token; None when no token is allowed (a grammar that can only end, and ending
        is forbidden)."""
        ...

    def sample_from(self, logits: np.ndarray) -> int | None:
        """Sample from logits the caller changed (or saved), and accept the token; None as above."""
        ...

    def grammar_allows_end(self) -> bool:
        """No grammar, or the grammar is complete."""
        ...

    def begin_turn(self) -> None:
        """A new turn: a grammar starts over."""
        ...

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens into the history (repetition penalties, DRY)."""
        ...

    def free(self) -> None: ...


class Batch(Protocol):
    """The tokens of the next decode, one run of tokens per sequence."""

    num_tokens: int
    logits: np.ndarray  # per row: 1 when the row's logits are wanted

    def clear(self) -> None: ...

    def add(self, tokens: Sequence[int], start_pos: int, seq_id: int, want_last_logits: bool) -> int:
        """Append a run of one sequence's tokens; returns the row of its last token."""
        ...


class StepCosts(Protocol):
    """What a decode step costs this backend and model, in units of a one-row step: ratios,
    not times, so a sequence's drafts do not depend on the machine's speed or other calls."""

    base_rows: float  # the linear view: a step of c rows costs about base_rows + c

    def step_cost(self, num_rows: int) -> float:
        """A one-ubatch step of `num_rows` rows, each with logits (decode and draft rows)."""
        ...

    def prefill_cost(self, num_tokens: int) -> float:
        """A one-ubatch prompt chunk of `num_tokens` tokens, logits on the last."""
        ...

    def num_ubatches(self, rows: Sequence[tuple[int, int]], n_ubatch: int, per_slot_streams: bool) -> int:
        """How many ubatches (graph runs) one decode's batch becomes; `rows`: (sequence id,
        tokens) in batch order; `per_slot_streams`: one KV stream per slot."""
        ...


class Runner(Protocol):
    meta: ModelMeta
    n_vocab: int
    batch: Batch
    costs: StepCosts

    @property
    def can_shift(self) -> bool: ...

    def decode(self) -> int:
        """Run the batch as filled; 0 on success (llama_decode's status otherwise)."""
        ...

    def use_adapters(self, adapters: AdapterSet) -> None:
        """The LoRA adapters the next decodes run under (names the runner has loaded)."""
        ...

    def load_adapter(self, name: str, checked: object) -> object:
        """Load a LoRA adapter file as `name`; `checked`: the runner's own check of the file,
        done off the executor thread (what it returns goes to the caller; raises when it cannot)."""
        ...

    def unload_adapter(self, name: str) -> object:
        """Free adapter `name`; returns its checked file (what `load_adapter` takes to load it again)."""
        ...

    def logits_row(self, row: int) -> np.ndarray: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def new_sampler(
        self, params: SamplingParams, n_ctx: int, banned_tokens: tuple[int, ...] = (), grammar: object | None = None
    ) -> TokenSampler:
        """`grammar`: the compiled form of `params.grammar` (opaque here; see Engine.compile_async)."""
        ...

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int) -> None: ...

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None: ...

    def seq_state(self, seq_id: int) -> bytes: ...

    def set_seq_state(self, seq_id: int, data: bytes) -> bool: ...

    def seq_pos_min(self, seq_id: int) -> int: ...

    def seq_pos_max(self, seq_id: int) -> int: ...

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]: ...

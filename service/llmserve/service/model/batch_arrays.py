"""The rows of the next decode as numpy arrays, filled a run of tokens at a time.

`BatchArrays` is the fill the engine sees (engine/runner_api.py's `Batch`): the real
runner's `BatchBuffer` (model/batch.py) points a llama_batch at these arrays, and the
tests' fake runner decodes straight from them. Numpy only, no llama_cpp, so the fake
runs without it. The arrays are allocated once and only ever written in place: the
llama_batch holds pointers into them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BatchArrays:
    """One row per token: `token`, `pos`, `seq` (each row carries exactly one sequence
    id) and `logits` (1 where the row's logits are wanted); rows 0..num_tokens-1 are used."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.num_tokens = 0

    def clear(self) -> None:
        self.num_tokens = 0

    def add(self, tokens: Sequence[int], start_pos: int, seq_id: int, want_last_logits: bool) -> int:
        """Append a run of one sequence's tokens at positions start_pos, start_pos + 1, ...;
        returns the row of its last token. Raises ValueError past the capacity."""
        n = len(tokens)
        i = self.num_tokens
        if i + n > self.capacity:
            raise ValueError(f"batch overflow: {i + n} > {self.capacity}")
        self.token[i : i + n] = tokens
        self.pos[i : i + n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.seq[i : i + n] = seq_id
        self.logits[i : i + n] = 0
        if want_last_logits:
            self.logits[i + n - 1] = 1
        self.num_tokens = i + n
        return i + n - 1

    def mark_all_outputs(self) -> None:
        self.logits[: self.num_tokens] = 1

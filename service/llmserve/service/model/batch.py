"""A llama_batch over `BatchArrays`' numpy arrays (a ctypes struct pointing at numpy memory).

Filling a batch element by element through ctypes costs ~0.8 µs per token;
slice assignment into numpy views costs nanoseconds. Every token carries exactly
one sequence id, so `seq_id[i]` points at row i of one contiguous int32 array.
The fill itself is `BatchArrays.add` (model/batch_arrays.py), shared with the tests'
fake runner.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from .batch_arrays import BatchArrays


class BatchBuffer(BatchArrays):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq.ctypes.data
        self._seq_ptrs = (i32p * capacity)(*(ctypes.cast(base + 4 * i, i32p) for i in range(capacity)))
        self.struct = llama_cpp.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(i32p),
            embd=None,
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self._n_seq_id.ctypes.data_as(i32p),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def finish(self) -> llama_cpp.llama_batch:
        self.struct.n_tokens = self.num_tokens
        return self.struct

"""Pooled embeddings on a context of their own, without the LM head.

A causal LM's graph in this llama.cpp (src/models/gemma3.cpp) always ends with the
LM head, and pooled embeddings need every token as an output (llama-context.cpp:
"pooled embedding requires that all tokens are output"), so a plain embedding
decode multiplies every token by the 262k-row output matrix: 57% of the work. The
graph's last hidden state is the node `result_embd_pooled` (the final norm, named
so by `build_pooling` when pooling is NONE), computed just before `result_output`.
A scheduler eval callback (`cb_eval`) asks for that node, copies it, and returns
false, which stops the graph there (ggml_backend_sched_compute_splits); the mean
is then taken per sequence with numpy. Measured on gemma-3-270m: the same vectors
as llama.cpp's MEAN pooling (cosine 0.9999999) in 0.41x the time. A model without
that node (an encoder) runs the whole graph and its per-token outputs are pooled.

Inputs are packed into one ubatch, one sequence id each; the caller guarantees they
fit (llama.cpp aborts the process on an oversize non-causal ubatch).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import llama_cpp
import numpy as np

from .batch import BatchBuffer

_GGML = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
_GGML.ggml_get_name.restype = ctypes.c_char_p
_GGML.ggml_get_name.argtypes = [ctypes.c_void_p]
_GGML.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
_GGML.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
_GGML.ggml_nelements.restype = ctypes.c_int64
_GGML.ggml_nelements.argtypes = [ctypes.c_void_p]

HIDDEN_NODE = b"result_embd_pooled"


class Embedder:
    def __init__(self, model: Any, n_embd: int, n_ubatch: int, max_seqs: int, n_threads: int) -> None:
        self.n_embd = n_embd
        self.n_ubatch = n_ubatch
        self.max_seqs = max_seqs
        self._captured: list[np.ndarray] = []
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)  # kept alive here
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ubatch
        params.n_batch = n_ubatch
        params.n_ubatch = n_ubatch
        params.n_seq_max = max_seqs
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE  # pooled here, from the hidden states
        params.kv_unified = True
        params.no_perf = True
        params.cb_eval = self._callback
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the embedding context")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = BatchBuffer(n_ubatch)

    def _on_node(self, tensor: int, ask: bool, _user_data: int) -> bool:
        if ask:
            return bool(_GGML.ggml_get_name(tensor) == HIDDEN_NODE)
        n = int(_GGML.ggml_nelements(tensor))
        self._captured.append(np.ctypeslib.as_array(_GGML.ggml_get_data_f32(tensor), shape=(n,)).copy())
        return False  # stop the graph: the LM head is not needed

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Mean-pooled hidden states, one vector per input (not normalized)."""
        batch = self.batch
        batch.clear()
        for seq_id, tokens in enumerate(inputs):
            batch.add(tokens, 0, seq_id, False)
        batch.mark_all_outputs()
        self._captured.clear()
        llama_cpp.llama_memory_clear(self.memory, True)
        status = int(llama_cpp.llama_decode(self.ctx, batch.finish()))
        if status != 0:
            raise RuntimeError(f"llama_decode (embeddings) failed with status {status}")
        hidden = self._hidden_states(batch.num_tokens)
        vectors, start = [], 0
        for tokens in inputs:
            vectors.append(hidden[start : start + len(tokens)].mean(axis=0))
            start += len(tokens)
        return vectors

    def _hidden_states(self, num_tokens: int) -> np.ndarray:
        if self._captured:
            hidden = np.concatenate(self._captured).reshape(-1, self.n_embd)
            if len(hidden) == num_tokens:
                return hidden
        # No such node (or an unexpected split): the graph ran to the end; read every output.
        ptr = llama_cpp.llama_get_embeddings(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(num_tokens, self.n_embd)).copy()

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

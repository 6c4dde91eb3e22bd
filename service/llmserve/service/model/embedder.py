"""Pooled embeddings on a context of their own: one ubatch of packed inputs per call.

Two sources of vectors:

* An embedding model (`--embedding-model`, or `-m NAME=PATH` of one: e.g. all-MiniLM-L6-v2):
  llama.cpp pools as the GGUF's `<arch>.pooling_type` says (mean, cls, last) with the
  attention the model declares (non-causal for BERT); `llama_get_embeddings_seq`
  gives one vector per sequence. The Embedder owns that model and its vocabulary.
* The generative model (`--embeddings` alone), or a model without pooling metadata:
  its hidden states, mean-pooled here. A causal LM's graph in this llama.cpp always
  ends with the LM head, and pooled embeddings need every token as an output, so a
  plain embedding decode multiplies every token by the 262k-row output matrix (57%
  of the work for gemma-3-270m). The last hidden state is the node
  `result_embd_pooled` (the final norm, so named by `build_pooling` when pooling is
  NONE); a scheduler eval callback (`cb_eval`) copies it and returns false, which
  stops the graph there. Measured on gemma-3-270m: llama.cpp's MEAN pooling's
  vectors (cosine 0.9999999) in 0.41x the time. The graph stops early, but llama.cpp
  still reserves and copies a logits row per output (1 MiB each at a 262k vocabulary), so
  this path decodes a job in pieces of `HIDDEN_PIECE_TOKENS` (exact for a causal model:
  each piece attends to the cached earlier ones): 64 logits rows, not one per input token
  (512 rows made `--embeddings` cost +470 MiB of resident memory once used).

Inputs are packed into one ubatch, one sequence id each; the caller guarantees that
each has at most `max_input_tokens` and that together they fit `n_ubatch` (llama.cpp
aborts the process on an oversize non-causal ubatch, and a position past the
model's trained context would index past a learned position table).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np

from ..domain.model_meta import ModelMeta
from .batch import BatchBuffer
from .tokenizer import POOLING_NAMES, Vocab, load_model

_GGML = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
_GGML.ggml_get_name.restype = ctypes.c_char_p
_GGML.ggml_get_name.argtypes = [ctypes.c_void_p]
_GGML.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
_GGML.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
_GGML.ggml_nelements.restype = ctypes.c_int64
_GGML.ggml_nelements.argtypes = [ctypes.c_void_p]

HIDDEN_NODE = b"result_embd_pooled"
HIDDEN_PIECE_TOKENS = 64  # tokens per decode when pooling hidden states here (see above)
MODEL_POOLINGS = (llama_cpp.LLAMA_POOLING_TYPE_MEAN, llama_cpp.LLAMA_POOLING_TYPE_CLS, llama_cpp.LLAMA_POOLING_TYPE_LAST)


class Embedder:
    """The embedding context. `tokenizer` and `meta` describe the model it runs."""

    def __init__(
        self, tokenizer: Vocab, meta: ModelMeta, n_ubatch: int, max_seqs: int, n_threads: int,
        owns_model: bool = False,
    ) -> None:
        self.model = model = tokenizer.model
        self.owns_model = owns_model
        self.tokenizer = tokenizer
        self.meta = meta
        self.n_embd = self.meta.n_embd
        self.n_ubatch = n_ubatch
        self.max_seqs = max_seqs
        # Positions past the trained context would index past a learned position table (BERT).
        self.max_input_tokens = min(n_ubatch, self.meta.n_ctx_train)
        self.pooling = tokenizer.pooling(meta)  # a generative model declares none: its hidden states, pooled here
        if self.pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK:
            raise RuntimeError(f"{meta.path} is a reranker (pooling 'rank'), not an embedding model")
        self.pools_in_llama = self.pooling in MODEL_POOLINGS
        self._captured: list[np.ndarray] = []
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)  # kept alive here
        params = llama_cpp.llama_context_default_params()
        # Pooled in llama.cpp (an embedding model, maybe non-causal): a job is one ubatch,
        # the embeddings clamp. Hidden states pooled here (a causal LM): pieces.
        piece = n_ubatch if self.pools_in_llama else min(n_ubatch, HIDDEN_PIECE_TOKENS)
        # llama.cpp reserves its graphs for n_seq_max outputs and, for MEAN pooling, for a
        # ubatch split evenly across n_seq_max sequences: a context batch below max_seqs or
        # not a multiple of it aborts the process (GGML_ASSERT in llama_context::output_reserve,
        # ggml_mul_mat in build_pooling; -ub 300 and -ub 7 did), and a causal model's batch is
        # clamped to n_ctx first. Decodes stay within `piece` tokens (self.batch).
        params.n_batch = params.n_ubatch = -(-piece // max_seqs) * max_seqs
        params.n_ctx = max(n_ubatch, params.n_batch)
        params.n_seq_max = max_seqs
        params.swa_full = True  # every packed input's cells stay visible across pieces
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = True
        params.kv_unified = True
        params.no_perf = True
        if self.pools_in_llama:
            params.pooling_type = self.pooling
        else:
            params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE  # pooled here, from the hidden states
            params.cb_eval = self._callback
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            self._free_model()
            raise RuntimeError("llama.cpp could not create the embedding context")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = BatchBuffer(piece)

    @classmethod
    def from_file(cls, path: Path, n_ubatch: int, max_seqs: int, n_threads: int) -> Embedder:
        """An embedding model of its own (`--embedding-model`)."""
        tokenizer = Vocab(load_model(path))
        return cls(tokenizer, tokenizer.read_meta(path), n_ubatch, max_seqs, n_threads, owns_model=True)

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES[self.pooling if self.pools_in_llama else llama_cpp.LLAMA_POOLING_TYPE_MEAN]

    def _on_node(self, tensor: int, ask: bool, _user_data: int) -> bool:
        if ask:
            return bool(_GGML.ggml_get_name(tensor) == HIDDEN_NODE)
        n = int(_GGML.ggml_nelements(tensor))
        self._captured.append(np.ctypeslib.as_array(_GGML.ggml_get_data_f32(tensor), shape=(n,)).copy())
        return False  # stop the graph: the LM head is not needed

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """One pooled vector per input (not normalized)."""
        batch = self.batch
        batch.clear()
        self._captured.clear()
        llama_cpp.llama_memory_clear(self.memory, True)  # no-op for encoders without memory
        for seq_id, tokens in enumerate(inputs):
            start = 0
            while start < len(tokens):  # pooled in llama.cpp: the whole job fits one piece
                if batch.num_tokens == batch.capacity:
                    self._decode_piece()
                end = min(len(tokens), start + batch.capacity - batch.num_tokens)
                batch.add(tokens[start:end], start, seq_id, False)
                start = end
        self._decode_piece()
        if self.pools_in_llama:
            return [self._pooled(seq_id) for seq_id in range(len(inputs))]
        hidden = self._hidden_states(sum(len(tokens) for tokens in inputs))
        vectors, start = [], 0
        for tokens in inputs:
            vectors.append(hidden[start : start + len(tokens)].mean(axis=0))
            start += len(tokens)
        return vectors

    def _decode_piece(self) -> None:
        num_tokens, num_captured = self.batch.num_tokens, len(self._captured)
        self.batch.mark_all_outputs()
        status = int(llama_cpp.llama_decode(self.ctx, self.batch.finish()))
        if status != 0:
            raise RuntimeError(f"llama_decode (embeddings) failed with status {status}")
        self.batch.clear()
        if not self.pools_in_llama and len(self._captured) == num_captured:
            # No such node: the graph ran to the end; read this piece's outputs.
            ptr = llama_cpp.llama_get_embeddings(self.ctx)
            self._captured.append(np.ctypeslib.as_array(ptr, shape=(num_tokens * self.n_embd,)).copy())

    def _pooled(self, seq_id: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_embeddings_seq(self.ctx, seq_id)
        if not ptr:
            raise RuntimeError(f"no pooled embedding for sequence {seq_id}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def _hidden_states(self, num_tokens: int) -> np.ndarray:
        hidden = np.concatenate(self._captured).reshape(-1, self.n_embd)
        if len(hidden) != num_tokens:
            raise RuntimeError(f"captured {len(hidden)} hidden states for {num_tokens} tokens")
        return hidden

    def _free_model(self) -> None:
        if self.owns_model and self.model:
            llama_cpp.llama_model_free(self.model)
        self.model = None

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        self._free_model()

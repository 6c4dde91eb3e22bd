"""Raw llama.cpp in the server's context shape, for the benchmarks that time `llama_decode`
itself (bench.adapter_contexts, bench.split_order): n_batch 2048, n_ubatch 512, one KV
stream per slot, -t 2, llama.cpp's log silenced."""

from __future__ import annotations

import ctypes

import llama_cpp
from llmserve.service.model.default_model import default_model_path

_QUIET = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it later


def load_default_model() -> llama_cpp.llama_model_p:
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    return llama_cpp.llama_model_load_from_file(str(default_model_path()).encode(),
                                                llama_cpp.llama_model_default_params())


def server_context(model: llama_cpp.llama_model_p, slots: int, n_ctx: int) -> llama_cpp.llama_context_p:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, 2048, 512, slots
    params.n_threads = params.n_threads_batch = 2
    params.kv_unified = False
    params.no_perf = True
    return llama_cpp.llama_init_from_model(model, params)


def decode_rows(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch,
                rows: list[tuple[int, int, int]]) -> None:
    """Decode (seq, position, token) rows, logits for each sequence's last row."""
    batch.n_tokens = len(rows)
    for i, (seq, pos, token) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = i == len(rows) - 1 or rows[i + 1][0] != seq
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError(f"llama_decode failed at rows {rows[:2]}")

"""Embeddings on the generative model: decoded in pieces (model/embedder.py), the same
vectors as llama.cpp's own mean pooling, without a logits row per input token."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import llama_cpp
import numpy as np
import pytest
from llmserve.client import Client
from llmserve.service.model.default_model import default_model_path
from llmserve.service.model.embedder import HIDDEN_PIECE_TOKENS, Embedder
from llmserve.service.model.tokenizer import Vocab, load_model

from harness.server import RunningServer, start_server, stop_server

LONG = "The river runs past the stone market, under the old bridge and out to the harbor. " * 16


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(["-np", "2", "-c", "4096", "-t", "2", "--embeddings"],
                           tmp_path_factory.mktemp("embed-pieces") / "server.log")
    yield running
    assert stop_server(running) == 0


def test_full_ubatch_embedding_jobs_add_no_logits_memory(embed_server: RunningServer) -> None:
    """Before pieces: a 512-token job reserved and wrote 512 logits rows (+~380 MiB)."""
    before = _rss_mib(embed_server.process.pid)
    with Client(embed_server.address, timeout=120) as client:
        vectors = list(client.embed([f"{i}: {LONG}"[:1800] for i in range(8)], batch_size=4))
    grown = _rss_mib(embed_server.process.pid) - before
    print(f"resident memory grew {grown} MiB over 8 embeddings of ~380 tokens")
    assert len(vectors) == 8
    assert grown < 150


def test_pieces_match_llama_cpp_mean_pooling() -> None:
    model = load_model(default_model_path())
    vocab = Vocab(model)
    texts = [LONG, "Paris is the capital of France.", "1, 2, 3, 4"]
    inputs = [tuple(vocab.tokenize(text, True, False)) for text in texts]
    assert len(inputs[0]) > 3 * HIDDEN_PIECE_TOKENS  # the long input spans several pieces
    embedder = Embedder(vocab, vocab.read_meta(default_model_path()), 512, 4, 2)
    ours = embedder.embed(inputs)
    embedder.close()
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 512
    params.n_seq_max, params.n_threads, params.n_threads_batch = 4, 2, 2
    params.embeddings, params.kv_unified, params.swa_full = True, True, True
    params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    ctx = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(512, 0, 4)
    n = 0
    for seq_id, tokens in enumerate(inputs):
        for pos, token in enumerate(tokens):
            batch.token[n], batch.pos[n], batch.n_seq_id[n], batch.logits[n] = token, pos, 1, 1
            batch.seq_id[n][0] = seq_id
            n += 1
    batch.n_tokens = n
    assert llama_cpp.llama_decode(ctx, batch) == 0
    for seq_id, vector in enumerate(ours):
        ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq_id)
        reference = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(len(vector),))
        cosine = float(vector @ reference / (np.linalg.norm(vector) * np.linalg.norm(reference)))
        print(f"input {seq_id} ({len(inputs[seq_id])} tokens): cosine {cosine:.7f}")
        assert cosine > 0.998  # other ubatch shapes than the reference's: ~0.9993 for short inputs
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)

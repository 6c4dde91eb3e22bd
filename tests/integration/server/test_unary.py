"""Tokenize, Detokenize and GetModelInfo against the real model."""

from __future__ import annotations

from llmserve.client import Client


def test_tokenize_roundtrip(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=30) as client:
        ids = client.tokenize("Hello, wörld!", add_special=True)
        assert ids[0] == client.model_info().bos_token_id
        assert client.detokenize(ids[1:]) == "Hello, wörld!"
        pieces = client.stub.Tokenize(
            __import__("llmserve.client", fromlist=["pb"]).pb.TokenizeRequest(text="Hello world", with_pieces=True)
        ).pieces
        assert b"".join(pieces).replace(b"\xe2\x96\x81", b" ") == b"Hello world"


def test_model_info_reports_the_clamped_batch_and_slots(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=30) as client:
        info = client.model_info()
    assert info.architecture == "gemma3"
    assert info.vocab_size == 262144
    assert info.can_generate and info.can_embed
    assert info.n_batch == info.n_ubatch == 512  # --embeddings clamps n_batch to n_ubatch
    assert info.n_parallel == len(info.slots) == 8
    assert info.n_ctx_per_slot == info.n_ctx // info.n_parallel
    assert 1 in info.eog_token_ids and info.pooling_type == "mean"

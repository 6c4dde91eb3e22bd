"""Embed: packing, the single-ubatch rule, ordering of a long stream."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from llmserve.client import Client, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import metric
from tests.helpers import cosine

OTHERS = [f"Sentence number {i} talks about topic {i * 7 % 13} in some detail." for i in range(15)]
TEXT = "The quick brown fox jumps over the lazy dog."


def test_alone_and_packed_with_fifteen_others_agree(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=60) as client:
        alone = next(client.embed([TEXT]))
        packed = list(client.embed([*OTHERS[:7], TEXT, *OTHERS[7:]], batch_size=16))
    assert len(packed) == 16
    assert abs(np.linalg.norm(alone) - 1.0) < 1e-4  # L2-normalized by default
    similarity = cosine(alone, packed[7])
    print(f"cosine alone vs packed with 15 others: {similarity:.6f}")
    assert similarity >= 0.995


def test_oversize_input_is_invalid_and_the_server_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=60) as client:
        huge = [5000 + (i % 1000) for i in range(3000)]
        with pytest.raises(grpc.RpcError) as err:
            list(client.embed([TEXT, huge]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "input 1 has 3000 tokens" in err.value.details()
        assert "512" in err.value.details()
        truncated = list(client.embed([huge], truncate=True))
        assert len(truncated) == 1
        assert len(next(client.embed([TEXT]))) == client.model_info().n_embd


def test_two_hundred_inputs_come_back_in_order(server) -> None:  # type: ignore[no-untyped-def]
    texts = [f"Document {i}: {'alpha beta gamma ' * (1 + i % 5)}" for i in range(200)]

    def requests():  # type: ignore[no-untyped-def]
        for start in range(0, 200, 7):
            yield pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts[start : start + 7]])

    with grpc.insecure_channel(server.address) as channel:
        responses = list(pb_grpc.LLMServiceStub(channel).Embed(requests(), timeout=120))
    assert [r.index for r in responses] == list(range(200))
    with Client(server.address, timeout=60) as client:
        for i in (0, 77, 199):
            solo = next(client.embed([texts[i]]))
            assert cosine(solo, list(responses[i].embedding)) > 0.99
    assert responses[3].num_tokens > responses[0].num_tokens


def test_a_cancelled_embed_call_leaves_no_work_behind(server) -> None:  # type: ignore[no-untyped-def]
    import time

    def computed() -> float:
        return metric(server.metrics_port, "llmserve_embeddings_total")

    before = computed()
    texts = [f"A text to embed, number {i}, about nothing in particular." for i in range(200)]
    with grpc.insecure_channel(server.address) as channel:
        call = pb_grpc.LLMServiceStub(channel).Embed(iter([pb.EmbedRequest(inputs=[pb.Input(text=t) for t in texts])]))
        next(call)
        call.cancel()
    # The step running when the call was cancelled finishes; then the count must stay put.
    settled, deadline = computed(), time.monotonic() + 30
    while True:
        time.sleep(2.0)
        now = computed()
        if now == settled or time.monotonic() > deadline:
            break
        settled = now
    assert computed() == settled  # nothing queued for the cancelled call is still running
    assert settled - before < 200

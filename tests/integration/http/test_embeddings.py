"""/v1/embeddings through the official `openai` SDK: the same vectors as gRPC Embed, float
and base64, against a real server started with --embeddings."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import numpy as np
import pytest
from llmserve.client import Client
from openai import BadRequestError, NotFoundError, OpenAI

from harness.server import RunningServer, free_port, start_server, stop_server

TEXTS = ["The lighthouse keeper watched the storm.", "Paris is the capital of France.", "1, 2, 3, 4"]


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["-np", "2", "-c", "4096", "-t", "2", "--embeddings"]
    running = start_server(args, tmp_path_factory.mktemp("http-embed") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


@pytest.fixture(scope="module")
def embed_client(embed_server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{embed_server.http_port}/v1", api_key="unused", max_retries=0,
                  timeout=120)


@pytest.fixture(scope="module")
def grpc_vectors(embed_server: RunningServer) -> np.ndarray:
    with Client(embed_server.address) as grpc_client:
        return np.array(list(grpc_client.embed(TEXTS)), dtype=np.float32)


def _decoded(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def test_float_vectors_equal_grpc_embed(embed_client: OpenAI, grpc_vectors: np.ndarray) -> None:
    reply = embed_client.embeddings.create(model="gemma-3-270m-q4_k_m", input=TEXTS)
    assert reply.object == "list" and [d.index for d in reply.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in reply.data)
    vectors = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert vectors.shape == grpc_vectors.shape
    np.testing.assert_allclose(vectors, grpc_vectors, atol=1e-6, rtol=0)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 3 * 5


def test_base64_vectors_equal_grpc_embed(embed_client: OpenAI, grpc_vectors: np.ndarray,
                                         embed_server: RunningServer) -> None:
    # The SDK asks for base64 by default and decodes it itself; raw, the body holds the strings.
    raw = embed_client.embeddings.with_raw_response.create(model="gemma-3-270m-q4_k_m", input=TEXTS,
                                                           encoding_format="base64").http_response.json()
    vectors = np.array([_decoded(d["embedding"]) for d in raw["data"]])
    np.testing.assert_allclose(vectors, grpc_vectors, atol=1e-6, rtol=0)
    one = embed_client.embeddings.create(model="gemma-3-270m-q4_k_m", input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, grpc_vectors[1], atol=1e-6, rtol=0)
    with Client(embed_server.address) as grpc_client:
        ids = grpc_client.tokenize(TEXTS[2], embedding_model=True)
        # the same inputs in the same batch: numerics depend on the batch's shape
        grpc_by_ids = np.array(list(grpc_client.embed([ids, ids[:5]])), dtype=np.float32)
    by_ids = embed_client.embeddings.create(model="gemma-3-270m-q4_k_m", input=[ids, ids[:5]])
    assert by_ids.usage.prompt_tokens == len(ids) + 5
    np.testing.assert_allclose([d.embedding for d in by_ids.data], grpc_by_ids, atol=1e-6, rtol=0)
    alone = embed_client.embeddings.create(model="gemma-3-270m-q4_k_m", input=ids)
    np.testing.assert_allclose(alone.data[0].embedding, grpc_vectors[2], atol=1e-6, rtol=0)


def test_refusals_name_the_field(embed_client: OpenAI) -> None:
    cases = [
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": "x", "dimensions": 7}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": [[1, 10**9]]}, "input[0]"),
        ({"input": "word " * 5000}, "input"),
        ({"input": "x", "extra_body": {"truncate": True}}, "truncate"),
    ]
    for kwargs, param in cases:
        with pytest.raises(BadRequestError) as refused:
            embed_client.embeddings.create(model="gemma-3-270m-q4_k_m", **kwargs)  # type: ignore[arg-type]
        assert refused.value.body["param"] == param, (kwargs, refused.value.message)
    with pytest.raises(NotFoundError):
        embed_client.embeddings.create(model="no-such-model", input="x")


def test_without_embeddings_it_is_not_found(client: OpenAI, model: str) -> None:
    with pytest.raises(NotFoundError) as refused:
        client.embeddings.create(model=model, input="x")
    assert refused.value.body["param"] == "model" and "--embeddings" in refused.value.message

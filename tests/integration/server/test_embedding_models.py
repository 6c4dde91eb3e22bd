"""An embedding model served as one of the models (`-m minilm=PATH`; served_models.py,
docs/adapters.md): all-MiniLM-L6-v2 beside the default generative model and a further
generative one, on an executor of its own with no generation context. The same file also
serves the default model's Embed through `--embedding-model`, so one server shows that both
ways give the same vectors. Over HTTP and gRPC the model is picked by name; a generation call
naming it, and an embedding call naming a generative further model, are refused naming the field."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from llmserve.client import Client, pb, session_config
from llmserve.client.errors import from_rpc_error
from llmserve.service.model.default_model import default_model_path

from harness.models import OTHER_MODEL, other_model_path
from harness.server import RunningServer, free_port, serving
from tests.helpers import cosine
from tools.embedding_model import convert

MINILM = "minilm"
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "東京は日本の首都です。", "hello",
             "SELECT name FROM users;", "Photosynthesis converts light energy into chemical energy."]
CLS, SEP = 101, 102  # MiniLM's vocabulary (gemma's has neither here)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    minilm = convert()  # `make test` converted it already (make embed-model); this only finds it
    flags = ["-m", str(default_model_path()), "-m", f"{MINILM}={minilm}", "-m", f"{OTHER_MODEL}={other_model_path()}",
             "--embedding-model", str(minilm), "-np", "2", "-c", "2048", "-t", "2"]
    with serving(flags, tmp_path_factory.mktemp("embedding-models") / "server.log", http_port=free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Client]:
    with Client(server.address, timeout=120) as c:
        yield c


def _url(server: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}{path}"


def _http_vectors(server: RunningServer, model: str | None) -> np.ndarray:
    body = {"input": SENTENCES, **({"model": model} if model else {})}
    reply = requests.post(_url(server, "/v1/embeddings"), json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return np.asarray([item["embedding"] for item in reply.json()["data"]])


def test_the_embedding_model_embeds_by_its_name_as_the_embedding_model_flag_does(server: RunningServer,
                                                                                 client: Client) -> None:
    named, flagged = _http_vectors(server, MINILM), _http_vectors(server, None)
    assert named.shape == (len(SENTENCES), 384)
    assert min(cosine(a, b) for a, b in zip(named, flagged)) > 0.9999
    over_grpc = np.asarray(list(client.embed(SENTENCES, model=MINILM)))
    assert min(cosine(a, b) for a, b in zip(over_grpc, named)) > 0.9999
    assert min(cosine(a, b) for a, b in zip(named[1:], named[:-1])) < 0.9  # distinct texts, distinct vectors


def test_a_generation_call_naming_the_embedding_model_is_refused_naming_the_field(server: RunningServer,
                                                                                  client: Client) -> None:
    reply = requests.post(_url(server, "/v1/chat/completions"), timeout=60,
                          json={"model": MINILM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model", reply.text
    assert "embedding model" in reply.json()["error"]["message"]
    reply = requests.post(_url(server, "/v1/completions"), json={"model": MINILM, "prompt": "Hi"}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model", reply.text
    config = session_config(max_tokens=2, model=MINILM)
    with pytest.raises(grpc.RpcError) as err:
        client.stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text="Hi")), timeout=60)
    error = from_rpc_error(err.value)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and error.field == "config.model", error


def test_embeddings_naming_a_generative_further_model_or_no_model_are_refused(server: RunningServer,
                                                                             client: Client) -> None:
    reply = requests.post(_url(server, "/v1/embeddings"), json={"model": OTHER_MODEL, "input": "Hi"}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "model", reply.text
    for model, code in ((OTHER_MODEL, grpc.StatusCode.FAILED_PRECONDITION), ("nothing", grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.RpcError) as err:
            list(client.stub.Embed(iter([pb.EmbedRequest(model=model, inputs=[pb.Input(text="Hi")])]), timeout=60))
        error = from_rpc_error(err.value)
        assert error.code() == code and error.field == "model", error


def test_the_embedding_model_is_listed_and_answers_its_unary_calls(server: RunningServer, client: Client) -> None:
    ids = [entry["id"] for entry in requests.get(_url(server, "/v1/models"), timeout=10).json()["data"]]
    assert MINILM in ids and OTHER_MODEL in ids
    info = client.stub.GetModelInfo(pb.GetModelInfoRequest(model=MINILM), timeout=30)
    assert info.architecture == "bert" and info.path.endswith("all-MiniLM-L6-v2-f16.gguf")
    assert info.can_embed and not info.can_generate and not any(s.busy for s in info.slots)
    tokens = client.stub.Tokenize(pb.TokenizeRequest(text="hello", add_special=True, model=MINILM), timeout=30).ids
    assert tokens[0] == CLS and tokens[-1] == SEP


def test_embeddings_and_generation_on_their_own_models_run_at_once(server: RunningServer, client: Client) -> None:
    config = session_config(max_tokens=24, temperature=0, ignore_eos=True)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = [pool.submit(client.stub.GenerateText, pb.GenerateTextRequest(config=config, input=pb.Input(text=s)),
                             timeout=120) for s in SENTENCES[:2]]
        vectors = [pool.submit(lambda: list(client.embed(SENTENCES * 8, model=MINILM))) for _ in range(2)]
        assert all(t.result().samples[0].turn_end.usage.completion_tokens == 24 for t in texts)
        assert all(len(v.result()) == len(SENTENCES) * 8 for v in vectors)


def test_an_embedding_model_alone_is_an_embedding_server(tmp_path: Path) -> None:
    """`-m minilm.gguf` as the only model (llama-server's `--embeddings -m bert.gguf`): Embed
    and /v1/embeddings serve it; a generation call is FAILED_PRECONDITION / 400, never a decode."""
    flags = ["-m", str(convert()), "-np", "1", "-c", "512", "-t", "2"]
    with serving(flags, tmp_path / "server.log", http_port=free_port()) as running, \
            Client(running.address, timeout=60) as client:
        assert len(list(client.embed(SENTENCES))) == len(SENTENCES)
        info = client.model_info()
        assert info.architecture == "bert" and info.can_embed and not info.can_generate
        with pytest.raises(grpc.RpcError) as err:
            client.stub.GenerateText(pb.GenerateTextRequest(config=session_config(max_tokens=2),
                                                            input=pb.Input(text="Hi")), timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "embedding model" in err.value.details()
        reply = requests.post(_url(running, "/v1/completions"), json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert reply.status_code == 400 and "embedding model" in reply.json()["error"]["message"], reply.text
        assert requests.post(_url(running, "/v1/embeddings"), json={"input": "Hi"}, timeout=60).status_code == 200

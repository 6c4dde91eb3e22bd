"""A server started without --embeddings: no Embed, no n_batch clamp."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from llmserve.client import Client, pb

from harness.server import RunningServer, start_server, stop_server
from tests.helpers import SessionStream


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(["-np", "2", "-c", "2048", "-t", "2", "-b", "1024", "--max-input-tokens", "40"], tmp_path_factory.mktemp("plain") / "server.log")
    yield running
    assert stop_server(running) == 0


def test_embed_is_failed_precondition(plain_server: RunningServer) -> None:
    with Client(plain_server.address, timeout=30) as client:
        with pytest.raises(grpc.RpcError) as err:
            list(client.embed(["hello"]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--embeddings" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            client.stub.Tokenize(pb.TokenizeRequest(text="hi", embedding_model=True), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # no embedding vocabulary to use
        info = client.model_info()
        assert not info.can_embed and not info.HasField("embedding_model")
        assert info.n_batch == 1024 and info.n_ubatch == 512  # no clamp without embeddings
        assert client.generate("Hi", max_tokens=3).turn_end.usage.completion_tokens == 3


def test_max_input_tokens_per_session(plain_server: RunningServer) -> None:
    with grpc.insecure_channel(plain_server.address) as channel:
        session = SessionStream(channel, max_tokens=2, temperature=0)
        session.send([2] + [1000] * 29)  # 30 tokens: fine
        session.read_turn()
        session.send([1001] * 20)  # 50 in the session: over --max-input-tokens 40
        with pytest.raises(grpc.RpcError) as err:
            session.read_turn()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-input-tokens" in err.value.details()

"""Over the slots plus --max-queue, the HTTP API answers 429 with Retry-After (RateLimitError),
and both surfaces count against the same limit (engine/call_gate.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import openai
import pytest
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI

from tests.conftest import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = [*CHAT_SERVER_ARGS[2:], "-np", "1", "--max-queue", "0"]  # CHAT_SERVER_ARGS starts with -np 4
    running = start_server(args, tmp_path_factory.mktemp("one-slot") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0


def test_a_full_server_answers_429_with_retry_after(one_slot_server: RunningServer, tmp_path: Path) -> None:
    client = OpenAI(base_url=f"http://127.0.0.1:{one_slot_server.http_port}/v1", api_key="none", max_retries=0, timeout=30)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Count to 5000."}]
    stream = client.chat.completions.create(model=model, messages=messages, stream=True,  # type: ignore[arg-type]
                                            max_tokens=1500, extra_body={"ignore_eos": True})
    assert next(iter(stream)).choices  # holds the only slot
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=model, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert int(caught.value.response.headers["Retry-After"]) >= 1 and caught.value.type == "rate_limit_error"
    stream.close()
    reply = OpenAI(base_url=client.base_url, api_key="none", max_retries=5).chat.completions.create(
        model=model, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "length"


def test_one_limit_for_both_surfaces(one_slot_server: RunningServer) -> None:
    """A gRPC stream holds the only slot: HTTP gets 429; an HTTP stream holds it: gRPC gets
    RESOURCE_EXHAUSTED (each wing counting its own would let both in)."""
    client = OpenAI(base_url=f"http://127.0.0.1:{one_slot_server.http_port}/v1", api_key="none", max_retries=0, timeout=30)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Count to 5000."}]
    long = pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=1500, ignore_eos=True))
    short = pb.GenerateTextRequest(config=pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=1)),
                                   input=pb.Input(text="Hi"))
    with grpc.insecure_channel(one_slot_server.address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        grpc_stream = stub.GenerateOnce(pb.GenerateOnceRequest(config=long, input=pb.Input(text="Count to 5000.")),
                                        timeout=60)
        assert next(grpc_stream).HasField("chunk")  # holds the only slot
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=model, messages=messages, max_tokens=1)  # type: ignore[arg-type]
        grpc_stream.cancel()
        http_stream = OpenAI(base_url=client.base_url, api_key="none", max_retries=5).chat.completions.create(
            model=model, messages=messages, stream=True, max_tokens=1500,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True})
        assert next(iter(http_stream)).choices
        with pytest.raises(grpc.RpcError) as refused:
            stub.GenerateText(short, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
        http_stream.close()

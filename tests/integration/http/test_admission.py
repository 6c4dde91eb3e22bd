"""Over the slots plus --max-queue, the HTTP API answers 429 with Retry-After (RateLimitError),
and both surfaces count against the same limit (engine/session_gate.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import openai
import pytest
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI

from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

T = TypeVar("T")
# A closed stream's slot comes back once the server sees the connection go (its next write, or the
# close itself): measured 0.05-0.46 s (the call included), at the first try or after one 429. The SDK's
# own retries (max_retries=5) used to hide how long it took; with the place given back 5 s late, this fails.
SLOT_BACK_S = 3.0


def _admitted_after_close(call: Callable[[], T]) -> T:
    """`call()` (the client retries nothing) again until the server stops refusing it 429, within
    SLOT_BACK_S of the first try; prints how long that took."""
    started, refusals = time.monotonic(), 0
    while True:
        try:
            result = call()
        except openai.RateLimitError:
            refusals += 1
            assert time.monotonic() - started < SLOT_BACK_S, f"the slot was not back within {SLOT_BACK_S} s"
            time.sleep(0.02)
            continue
        print(f"admitted {time.monotonic() - started:.2f} s after the holder closed ({refusals} refusals before)")
        return result


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
    reply = _admitted_after_close(lambda: client.chat.completions.create(
        model=model, messages=messages, max_tokens=1))  # type: ignore[arg-type]
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
        http_stream = _admitted_after_close(lambda: client.chat.completions.create(
            model=model, messages=messages, stream=True, max_tokens=1500,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True}))
        assert next(iter(http_stream)).choices
        with pytest.raises(grpc.RpcError) as refused:
            stub.GenerateText(short, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
        http_stream.close()

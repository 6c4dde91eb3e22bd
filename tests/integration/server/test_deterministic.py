"""Deterministic mode on the real server and model (docs/deterministic.md): a deterministic
turn's greedy tokens *and their logprobs* are the same bits alone on a cold cache, beside 15
other sessions, and alone again on a warm one. Without the mode the logprobs move with the
batch shape (measured here: all 16 prompts' logprobs differ between alone and together), so
comparing floats bit for bit is what shows the mode working; the tokens alone rarely flip."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import grpc
import pytest
import requests
from llmserve.client import pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import RunningServer, free_port, serving
from tests.helpers import field_of

HEAD = "Write a long story about a journey. " * 3
COLOURS = ("red", "green", "blue", "white")
# Prompts sharing a head, 40 to 450 tokens: some end inside the first 256-token chunk,
# some past it, and neighbours share a prefix that ends mid-chunk.
PROMPTS = [HEAD + f"Question {i}: tell me about the number {i * 7} and the colour {COLOURS[i % 4]}."
           + " More context." * (i * 9) for i in range(16)]
TOKENS = 32
Output = tuple[tuple[int, ...], tuple[float, ...]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(["-np", "16", "-c", "16384", "-t", "2"], tmp_path_factory.mktemp("deterministic") / "server.log",
                 http_port=free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.LLMServiceStub:
    return pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))


def _greedy(stub: pb_grpc.LLMServiceStub, prompt: str, deterministic: bool) -> Output:
    config = session_config(max_tokens=TOKENS, temperature=0, ignore_eos=True, logprobs=True,
                            deterministic=deterministic)
    reply = stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text=prompt)), timeout=300)
    sample = reply.samples[0]
    return tuple(sample.token_ids), tuple(t.logprob for t in sample.logprobs)


def _three_ways(stub: pb_grpc.LLMServiceStub, deterministic: bool) -> tuple[list[Output], list[Output], list[Output]]:
    cold = [_greedy(stub, p, deterministic) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _greedy(stub, p, deterministic), PROMPTS))
    warm = [_greedy(stub, p, deterministic) for p in PROMPTS]
    return cold, together, warm


def test_greedy_output_is_the_same_bits_alone_beside_15_others_cold_and_warm(stub: pb_grpc.LLMServiceStub) -> None:
    cold, together, warm = _three_ways(stub, deterministic=True)
    assert all(len(ids) == TOKENS for ids, _ in cold)
    differing = [i for i in range(len(PROMPTS)) if not cold[i] == together[i] == warm[i]]
    assert differing == [], f"prompts {differing} differ between alone, together and warm"
    plain_cold, plain_together, _ = _three_ways(stub, deterministic=False)
    moved = sum(a[1] != b[1] for a, b in zip(plain_cold, plain_together, strict=True))
    print(f"without the mode, {moved} of {len(PROMPTS)} prompts' logprobs differ between alone and together")


def test_http_deterministic_beside_other_calls_and_the_refusals(stub: pb_grpc.LLMServiceStub,
                                                                  server: RunningServer) -> None:
    url = f"http://127.0.0.1:{server.http_port}/v1/completions"
    body = {"prompt": PROMPTS[9], "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 1,
            "deterministic": True}

    def logprobs(**extra: object) -> list[float]:
        reply = requests.post(url, json={**body, **extra}, timeout=300)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["logprobs"]["token_logprobs"]

    alone = logprobs()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        beside = [pool.submit(logprobs, deterministic=False, prompt=p) for p in PROMPTS[:7]]
        mine = pool.submit(logprobs)
        assert mine.result() == alone
        for other in beside:
            other.result()
    refused = requests.post(url, json={**body, "deterministic": "yes"}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "deterministic"
    config = session_config(max_tokens=2, deterministic=True, prompt_logprobs=True)
    with pytest.raises(grpc.RpcError) as error:
        stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text="Hi")), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_of(error.value) == "config.output.prompt_logprobs"

"""n > 1: one prefill, the KV copied into extra sequences, samples tagged by index."""

from __future__ import annotations

import time

import grpc
import pytest
from llmserve.client import Client, make_input, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import counted


def _batch_tokens(port: int) -> float:
    return counted(port, 'llmserve_batch_tokens_sum{kind="generate"}')  # 0: no generation step yet on this server


def test_three_samples_share_one_prefill(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "A long shared prompt about the history of the bicycle. " * 12 + "Continue:"
    config = pb.SessionConfig(
        sampling=pb.SamplingParams(temperature=1.0, seed=7),
        stopping=pb.StoppingCriteria(max_tokens=6, ignore_eos=True),
        n=3,
    )
    before = _batch_tokens(server.metrics_port)
    request = pb.GenerateRequest(config=config, input=make_input(prompt), end_of_turn=True)
    with grpc.insecure_channel(server.address) as channel:
        responses = list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=60))
    evaluated = _batch_tokens(server.metrics_port) - before
    ends = {r.turn_end.index: r.turn_end for r in responses if r.HasField("turn_end")}
    ids = {i: [t for r in responses if r.HasField("chunk") and r.chunk.index == i for t in r.chunk.token_ids] for i in range(3)}
    assert sorted(ends) == [0, 1, 2]
    assert all(len(ids[i]) == 6 and ends[i].usage.completion_tokens == 6 for i in range(3))
    assert {ends[i].seed for i in range(3)} == {7, 8, 9}
    assert len({tuple(v) for v in ids.values()}) > 1  # different seeds, different samples
    prompt_tokens = ends[0].usage.prompt_tokens
    print(f"n=3: {evaluated:.0f} tokens evaluated for a {prompt_tokens}-token prompt and 3x6 samples")
    assert evaluated < prompt_tokens + 3 * 6 + 2  # the prompt was prefilled once
    with Client(server.address, timeout=10) as client:
        deadline = time.monotonic() + 5
        while any(s.busy for s in client.model_info().slots):  # the close lands a step later
            assert time.monotonic() < deadline, "sample slots not released"
            time.sleep(0.02)
        assert client.model_info().features.max_samples == 8


def test_n_is_capped(server) -> None:  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(config=pb.SessionConfig(n=9), input=make_input("Hi"), end_of_turn=True)
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_model_info_features(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=10) as client:
        features = client.model_info().features
    assert {"top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc", "dry", "mirostat", "logit_bias"} <= set(features.samplers)
    assert features.max_top_logprobs == 20 and features.grammar and features.json_schema and features.prompt_logprobs

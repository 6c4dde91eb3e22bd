"""The one-shot RPCs: GenerateOnce (server streaming) and GenerateText (unary) give what a
Generate session of one turn gives, with the same validation and statuses."""

from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import Client, make_input, pb, session_config
from llmserve.client.results import collect
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import scrape
from tests.helpers import buf_curl

PROMPT = "List three colours:"


def test_generate_once_streams_what_a_session_turn_gives(fresh_server) -> None:  # type: ignore[no-untyped-def]
    with Client(fresh_server.address, timeout=120) as client:
        bidi = client.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
        responses = list(client.stream_once(PROMPT, max_tokens=12, temperature=0, ignore_eos=True))
    once = collect(responses)
    assert all(isinstance(r, pb.GenerateOnceResponse) for r in responses)
    assert sum(r.HasField("chunk") for r in responses) >= 2  # streamed, not all at once
    # Like with like: the second call lands on the slot the first one left, samples its first
    # token from the logits saved there and decodes alone in the same cells.
    assert once.text == bidi.text and once.token_ids == bidi.token_ids
    assert once.turn_end.usage.completion_tokens == 12
    assert once.turn_end.finish_reason == pb.FINISH_REASON_LENGTH


def test_generate_text_answers_every_sample_at_once(fresh_server) -> None:  # type: ignore[no-untyped-def]
    with Client(fresh_server.address, timeout=120) as client:
        reply = client.generate_text(PROMPT, max_tokens=8, temperature=0.9, seed=3, n=2, top_logprobs=2)
        greedy = client.generate_text(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
        bidi = client.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert [s.index for s in reply.samples] == [0, 1]
    for sample in reply.samples:
        assert sample.turn_end.usage.completion_tokens == len(sample.token_ids) > 0
        assert len(sample.logprobs) == len(sample.token_ids) and sample.text
    assert reply.request_id
    # Like with like: bidi repeats greedy on the slot greedy left, from its saved logits.
    assert greedy.samples[0].text == bidi.text


def test_one_shot_calls_validate_like_generate(fresh_server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(fresh_server.address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        bad = pb.GenerateOnceRequest(config=session_config(max_tokens=0), input=make_input("Hi"))
        with pytest.raises(grpc.RpcError) as once:
            list(stub.GenerateOnce(bad, timeout=30))
        with pytest.raises(grpc.RpcError) as text:
            stub.GenerateText(pb.GenerateTextRequest(config=bad.config, input=bad.input), timeout=30)
        with pytest.raises(grpc.RpcError) as no_config:
            stub.GenerateText(pb.GenerateTextRequest(input=bad.input), timeout=30)
    for err in (once.value, text.value, no_config.value):
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(once.value)  # type: ignore[arg-type]
    violation = error_details_pb2.BadRequest()
    assert status is not None and any(d.Unpack(violation) for d in status.details)
    assert violation.field_violations[0].field.endswith("max_tokens")
    assert rpc_status.from_call(no_config.value) is not None  # type: ignore[arg-type]


def test_one_shot_calls_are_counted(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=120) as client:
        client.generate_text("Hi", max_tokens=2)
        list(client.stream_once("Hi", max_tokens=2))
    page = scrape(server.metrics_port)
    for rpc in ("GenerateOnce", "GenerateText"):
        assert page.has("llmserve_requests_total", code="OK", rpc=rpc), rpc


def test_buf_curl_calls_generate_once(server) -> None:  # type: ignore[no-untyped-def]
    request = {"config": {"sampling": {"temperature": 0}, "stopping": {"maxTokens": 4}}, "input": {"text": "Hello"}}
    out = buf_curl("-d", json.dumps(request), f"http://{server.address}/llmserve.v1.LLMService/GenerateOnce")
    messages = [json.loads(chunk) for chunk in out.replace("}\n{", "}\x00{").split("\x00")]
    assert messages[-1]["turnEnd"]["usage"]["completionTokens"] == 4
    text = buf_curl("-d", json.dumps(request), f"http://{server.address}/llmserve.v1.LLMService/GenerateText")
    assert json.loads(text)["samples"][0]["turnEnd"]["usage"]["completionTokens"] == 4

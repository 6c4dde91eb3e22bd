"""Bad input: a clear INVALID_ARGUMENT naming the field, and the server keeps serving."""

from __future__ import annotations

import grpc
import pytest
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tests.helpers import field_of, generate

CASES = {
    "empty input": (pb.GenerateRequest(config=session_config(), end_of_turn=True), "input"),
    "empty text": (
        pb.GenerateRequest(config=session_config(), input=pb.Input(text=""), end_of_turn=True),
        "input.text",
    ),
    "negative token id": (
        pb.GenerateRequest(config=session_config(), input=make_input([2, -1]), end_of_turn=True),
        "input.tokens.ids",
    ),
    "token id past the vocabulary": (
        pb.GenerateRequest(config=session_config(), input=make_input([2, 262144]), end_of_turn=True),
        "input.tokens.ids",
    ),
    "NaN temperature": (
        pb.GenerateRequest(config=session_config(temperature=float("nan")), input=make_input("hi"), end_of_turn=True),
        "config.sampling.temperature",
    ),
    "negative temperature": (
        pb.GenerateRequest(config=session_config(temperature=-1.0), input=make_input("hi"), end_of_turn=True),
        "config.sampling.temperature",
    ),
    "negative top_p": (
        pb.GenerateRequest(config=session_config(top_p=-0.5), input=make_input("hi"), end_of_turn=True),
        "config.sampling.top_p",
    ),
    "negative top_k": (
        pb.GenerateRequest(config=session_config(top_k=-3), input=make_input("hi"), end_of_turn=True),
        "config.sampling.top_k",
    ),
    "max_tokens beyond the context": (
        pb.GenerateRequest(config=session_config(max_tokens=10**6), input=make_input("hi"), end_of_turn=True),
        "config.stopping.max_tokens",
    ),
    "no config": (pb.GenerateRequest(input=make_input("hi"), end_of_turn=True), "config"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_generate_input_is_invalid_argument(server, case: str) -> None:  # type: ignore[no-untyped-def]
    request, field = CASES[case]
    with pytest.raises(grpc.RpcError) as err:
        generate(server.address, request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field_of(err.value) == field
    with Client(server.address, timeout=30) as client:  # the server keeps serving
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2


def test_prompt_longer_than_the_slot_is_invalid(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=30) as client:
        per_slot = client.model_info().n_ctx_per_slot
        with pytest.raises(grpc.RpcError) as err:
            client.generate([2] + [1000] * per_slot, max_tokens=1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(per_slot) in err.value.details()


def test_bad_detokenize_ids(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=30) as client, pytest.raises(grpc.RpcError) as err:
        client.detokenize([1, 999999999])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_limits_on_stop_strings_and_embed_messages(server) -> None:  # type: ignore[no-untyped-def]
    too_many = pb.GenerateRequest(config=session_config(stop=[f"s{i}" for i in range(17)]), input=make_input("hi"), end_of_turn=True)
    too_long = pb.GenerateRequest(config=session_config(stop=["x" * 300]), input=make_input("hi"), end_of_turn=True)
    for request, field in ((too_many, "config.stopping.stop"), (too_long, "config.stopping.stop[0]")):
        with pytest.raises(grpc.RpcError) as err:
            generate(server.address, request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field_of(err.value) == field
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        request = pb.EmbedRequest(inputs=[pb.Input(text="x")] * 1025)
        list(pb_grpc.LLMServiceStub(channel).Embed(iter([request]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_of(err.value) == "inputs"


def test_message_larger_than_the_limit_is_refused_by_grpc(server) -> None:  # type: ignore[no-untyped-def]
    # --max-message-bytes (16 MiB by default) is enforced by gRPC itself.
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        request = pb.EmbedRequest(inputs=[pb.Input(text="y" * (17 * 1024 * 1024))])
        list(pb_grpc.LLMServiceStub(channel).Embed(iter([request]), timeout=30))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with Client(server.address, timeout=30) as client:
        assert client.generate("Hello", max_tokens=1).turn_end.usage.completion_tokens == 1


LONG = "x" * 100_000


@pytest.mark.parametrize(("config", "field"), [
    (session_config(adapter=LONG), "config.adapter"),
    (session_config(continue_from=LONG), "config.continue_from"),
    (session_config(tool_choice=LONG, tools=[{"name": "f"}]), "config.tool_choice"),
    (session_config(model=LONG), "config.model"),
], ids=["adapter", "continue_from", "tool_choice", "model"])
def test_a_huge_value_echoed_in_a_refusal_is_cut_so_the_status_arrives(server, config: pb.SessionConfig,
                                                                        field: str) -> None:  # type: ignore[no-untyped-def]
    """A refusal that quotes the client's value travels in trailers; whole, 100 kB of it made
    the client drop the call (RESOURCE_EXHAUSTED 'received metadata size exceeds hard limit')."""
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as caught:
        stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text="hi")), timeout=60)
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), caught.value
    assert field_of(caught.value).startswith(field) and len(caught.value.details() or "") < 1100

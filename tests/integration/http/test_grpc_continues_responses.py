"""gRPC reaches the stored conversations the Responses API keeps (issue 42 §5):
`SessionConfig.continue_from` continues a response stored by `POST /v1/responses`, found
with the same API key, rendered as HTTP's `previous_response_id` renders it, and served
from the KV the stored turn left on its slot."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from llmserve.client import pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI

from harness.server import RunningServer, free_port, serving
from tests.helpers import field_of

KEY = "continue-key"
MODEL = "gemma-3-270m-q4_k_m"
AUTH = (("authorization", f"Bearer {KEY}"),)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("continue") / "server.log"
    with serving(["-np", "2", "-c", "4096", "-t", "2", "--api-key", KEY], log, http_port=free_port()) as running:
        yield running


def _continue(stub: pb_grpc.LLMServiceStub, stored_id: str, messages: list[tuple[str, str]],
              **config: object) -> pb.GenerateTextResponse:
    cfg = session_config(continue_from=stored_id, max_tokens=4, temperature=0, **config)  # type: ignore[arg-type]
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages])
    return stub.GenerateText(pb.GenerateTextRequest(config=cfg, input=pb.Input(messages=chat)), timeout=120,
                             metadata=AUTH)


def test_a_grpc_turn_continues_a_stored_response_from_its_kv(server: RunningServer) -> None:
    client = OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=KEY, max_retries=0)
    first = client.responses.create(model=MODEL, input="My name is Ada. Remember it.", max_output_tokens=8,
                                    temperature=0)
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    reply = _continue(stub, first.id, [("user", "What is my name?")])
    usage = reply.samples[0].turn_end.usage
    over_http = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?",
                                        max_output_tokens=4, temperature=0)
    assert usage.prompt_tokens == over_http.usage.input_tokens  # the same conversation, rendered the same way
    assert usage.prompt_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert usage.cached_tokens >= first.usage.input_tokens  # the stored turn's KV, not prefilled again


def test_what_continue_from_refuses(server: RunningServer) -> None:
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as unknown:
        _continue(stub, "resp_unknown", [("user", "Hi")])
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(unknown.value) == "config.continue_from"
    client = OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=KEY, max_retries=0)
    stored = client.responses.create(model=MODEL, input="Hello.", max_output_tokens=2)
    cfg = session_config(continue_from=stored.id, max_tokens=2)
    with pytest.raises(grpc.RpcError) as text:  # a stored conversation continues as a chat
        stub.GenerateText(pb.GenerateTextRequest(config=cfg, input=pb.Input(text="Hi")), timeout=60, metadata=AUTH)
    assert text.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(text.value) == "input"
    with pytest.raises(grpc.RpcError) as named:
        _continue(stub, stored.id, [("user", "Hi")], session_id="mine")
    assert named.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(named.value) == "config.continue_from"


def _chat_turns(stub: pb_grpc.LLMServiceStub, config: pb.SessionConfig, turns: list[str],
                metadata: tuple[tuple[str, str], ...] = AUTH) -> list[pb.TurnEnd]:
    """One Generate session, a user message per turn; each turn's end."""
    requests = [pb.GenerateRequest(config=config if i == 0 else None, end_of_turn=True, input=pb.Input(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))) for i, text in enumerate(turns)]
    ends: list[pb.TurnEnd] = []
    call = stub.Generate(iter(requests), timeout=120, metadata=metadata)
    for response in call:
        if response.HasField("turn_end"):
            ends.append(response.turn_end)
    return ends


def test_a_grpc_session_stores_its_turns_to_be_continued(server: RunningServer) -> None:
    """`SessionConfig.store`: each turn's conversation kept under `TurnEnd.stored_id`, continued
    by a new gRPC session (`continue_from`) or over HTTP (`previous_response_id`)."""
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    ends = _chat_turns(stub, session_config(store=True, max_tokens=4, temperature=0),
                       ["My name is Ada.", "Say my name."])
    assert len(ends) == 2 and all(e.stored_id.startswith("resp_") for e in ends)
    assert ends[0].stored_id != ends[1].stored_id
    second = ends[1]
    reply = _continue(stub, second.stored_id, [("user", "Again?")])
    usage = reply.samples[0].turn_end.usage
    assert usage.prompt_tokens > second.usage.prompt_tokens + second.usage.completion_tokens  # both turns came first
    assert usage.cached_tokens >= second.usage.prompt_tokens  # from the session's KV
    client = OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=KEY, max_retries=0)
    record = client.responses.retrieve(second.stored_id)
    assert record.status == "completed" and record.model == MODEL and record.output_text is not None
    over_http = client.responses.create(model=MODEL, previous_response_id=second.stored_id, input="Again?",
                                        max_output_tokens=4, temperature=0)
    assert over_http.usage.input_tokens == usage.prompt_tokens  # the same conversation, rendered the same way


def test_what_store_refuses_and_when_it_keeps_nothing(server: RunningServer) -> None:
    stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as text:
        stub.GenerateText(pb.GenerateTextRequest(config=session_config(store=True, max_tokens=2),
                                                 input=pb.Input(text="Hi")), timeout=60, metadata=AUTH)
    assert text.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(text.value) == "config.store"
    plain = _chat_turns(stub, session_config(max_tokens=2), ["Hello."])
    assert plain[0].stored_id == ""  # not asked: nothing kept

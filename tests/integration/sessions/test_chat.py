"""Chat messages rendered with a chat template; multi-turn reuses the KV prefix."""

from __future__ import annotations

import grpc
import pytest
from llmserve.client import Client, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tests.helpers import SessionStream


def _messages(*pairs: tuple[str, str]) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in pairs])


def test_the_default_model_chats_with_the_template_the_package_ships(server, chat_server) -> None:  # type: ignore[no-untyped-def]
    """The default GGUF has no chat template and `server` passes no flag: the Gemma 3 template
    the package ships renders the messages, as the same file given by flag does."""
    messages = _messages(("system", "You are terse."), ("user", "Name a colour."))
    prompt_tokens = []
    for running, source in ((server, "packaged"), (chat_server, "file")):
        with Client(running.address, timeout=30) as client:
            features = client.model_info().features
            assert features.chat and features.chat_template_source == source
        request = pb.GenerateRequest(config=pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=4)),
                                     input=pb.Input(messages=messages), end_of_turn=True)
        with grpc.insecure_channel(running.address) as channel:
            responses = list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=30))
        (end,) = [r.turn_end for r in responses if r.WhichOneof("event") == "turn_end"]
        prompt_tokens.append(end.usage.prompt_tokens)
    assert prompt_tokens[0] == prompt_tokens[1] > 12  # the template's turns wrap the two messages


def test_multi_turn_chat_sends_only_new_messages_and_reuses_the_kv(chat_server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(chat_server.address) as channel, Client(chat_server.address, timeout=30) as client:
        assert client.model_info().features.chat_template_source == "file"
        session = SessionStream(channel, max_tokens=24, temperature=0)
        session.send(pb.Input(messages=_messages(("system", "You are terse."), ("user", "Name a colour."))))
        reply1, ids1, end1 = session.read_turn()
        assert end1.usage.completion_tokens >= 1
        session.send(pb.Input(messages=_messages(("user", "Name another one."))))
        reply2, _, end2 = session.read_turn()
        session.close()
        # Turn 2's input is the whole conversation rendered again; the KV already holds
        # turn 1's rendering and reply, so all of that is cached.
        first_prompt = client.tokenize(
            "<bos><start_of_turn>user\nYou are terse.\n\nName a colour.<end_of_turn>\n<start_of_turn>model\n",
            add_special=False,
        )
    assert end1.usage.prompt_tokens == len(first_prompt)
    print(f"turn 2: prompt {end2.usage.prompt_tokens} tokens, cached {end2.usage.cached_tokens}; reply1 {reply1!r}")
    assert end2.usage.cached_tokens >= len(first_prompt) + len(ids1) - 3
    assert end2.usage.prompt_tokens - end2.usage.cached_tokens < 20  # only the new message's tokens and markup


def test_template_errors_are_invalid_argument(chat_server) -> None:  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(
        config=pb.SessionConfig(),
        input=pb.Input(messages=_messages(("assistant", "I speak first."), ("assistant", "Twice."))),
        end_of_turn=True,
    )
    with grpc.insecure_channel(chat_server.address) as channel, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "alternate" in err.value.details()

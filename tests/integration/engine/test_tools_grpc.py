"""Tool calling's generic format against the real model (engine/tools.py): the preamble as a
system message and the reply held to `reply_schema` by the JSON-schema constraint, over
today's gRPC surface. Whatever the model picks, the reply parses, and a call's arguments
validate against its function's schema."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest
from llmserve.client import pb
from llmserve.service.engine.tools import MAX_PARALLEL_CALLS, Tool, ToolChoice, parse_reply, preamble, reply_schema
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

WEATHER = Tool("get_weather", "Current weather for a city", json.dumps({
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}))
TIME = Tool("get_time", "The local time in a time zone", json.dumps({
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}, "required": ["zone"]}))
TOOLS = {t.name: t for t in (WEATHER, TIME)}


def _reply(address: str, choice: ToolChoice, question: str, parallel: bool = False) -> str:
    schema = reply_schema(list(TOOLS.values()), choice, parallel)
    assert schema is not None
    messages = pb.ChatMessages(messages=[
        pb.ChatMessage(role="system", content=preamble(list(TOOLS.values()), schema)),
        pb.ChatMessage(role="user", content=question),
    ])
    config = pb.SessionConfig(
        sampling=pb.SamplingParams(temperature=0.0), stopping=pb.StoppingCriteria(max_tokens=320),
        constraint=pb.Constraint(json_schema=json.dumps(schema)),
    )
    request = pb.GenerateRequest(config=config, input=pb.Input(messages=messages), end_of_turn=True)
    with grpc.insecure_channel(address) as channel:
        responses = list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=120))
    end = responses[-1].turn_end
    assert end.finish_reason == pb.FinishReason.FINISH_REASON_STOP, end  # the grammar completed
    return "".join(r.chunk.text for r in responses if r.HasField("chunk"))


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "get_time")])
def test_a_required_call_parses_and_its_arguments_validate(chat_server, choice: ToolChoice) -> None:  # type: ignore[no-untyped-def]
    reply = parse_reply(_reply(chat_server.address, choice, "What is the weather in Oslo, in celsius?"))
    assert reply.content is None and len(reply.tool_calls) == 1, reply
    call = reply.tool_calls[0]
    if choice.mode == "function":
        assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), json.loads(TOOLS[call.name].parameters))


def test_auto_gives_a_call_or_an_answer_and_parallel_calls_parse(chat_server) -> None:  # type: ignore[no-untyped-def]
    auto = parse_reply(_reply(chat_server.address, ToolChoice("auto"), "Say hello to me."))
    assert (auto.content is not None) != bool(auto.tool_calls), auto
    for call in auto.tool_calls:
        jsonschema.validate(json.loads(call.arguments), json.loads(TOOLS[call.name].parameters))
    several = parse_reply(_reply(chat_server.address, ToolChoice("required"), "Weather in Oslo and time in UTC?",
                                 parallel=True))
    assert 1 <= len(several.tool_calls) <= MAX_PARALLEL_CALLS
    assert len({c.id for c in several.tool_calls}) == len(several.tool_calls)
    for call in several.tool_calls:
        jsonschema.validate(json.loads(call.arguments), json.loads(TOOLS[call.name].parameters))

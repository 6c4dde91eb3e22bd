"""Tool calling over gRPC against the real model: `SessionConfig.tools`, `tool_choice` and
`parallel_tool_calls` hold the reply to the generic format (engine/chat/tools.py). Whatever the
model picks, a call's arguments validate against its function's schema; the chunks'
`tool_calls` deltas add up to the turn end's calls; a tool's result goes back as a `tool`
message on the next turn of the same session."""

from __future__ import annotations

import json
import queue

import grpc
import jsonschema
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import pb
from llmserve.service.engine.chat.tools import MAX_PARALLEL_CALLS
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

WEATHER = pb.Tool(name="get_weather", description="Current weather for a city", parameters=json.dumps({
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}))
TIME = pb.Tool(name="get_time", description="The local time in a time zone", parameters=json.dumps({
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}, "required": ["zone"]}))
SCHEMAS = {t.name: json.loads(t.parameters) for t in (WEATHER, TIME)}
Mode = pb.ToolChoice.Mode


def _config(mode: int, function: str = "", parallel: bool = False, max_tokens: int = 320,
            **extra: object) -> pb.SessionConfig:
    return pb.SessionConfig(sampling=pb.SamplingParams(temperature=0.0), stopping=pb.StoppingCriteria(
                            max_tokens=max_tokens), tools=[WEATHER, TIME], parallel_tool_calls=parallel,
                            tool_choice=pb.ToolChoice(mode=mode, function_name=function), **extra)


def _user(text: str) -> pb.Input:
    return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))


def _turn(responses: list[pb.GenerateResponse]) -> tuple[str, dict[int, dict[str, str]], pb.TurnEnd]:
    """One turn's answer text, its calls reassembled from the chunks' deltas, its turn end."""
    text, calls = [], {}
    for r in responses:
        if r.HasField("chunk"):
            text.append(r.chunk.text)
            for d in r.chunk.tool_calls:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                if d.id:
                    call.update(id=d.id, name=d.name)
                call["arguments"] += d.arguments
    return "".join(text), calls, responses[-1].turn_end


def _validated(end: pb.TurnEnd, calls: dict[int, dict[str, str]]) -> None:
    assert end.finish_reason == pb.FinishReason.FINISH_REASON_TOOL_CALLS, end
    assert [(c["id"], c["name"], c["arguments"]) for c in calls.values()] == [
        (c.id, c.name, c.arguments) for c in end.tool_calls]  # streamed as they formed = the whole calls
    for call in end.tool_calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("mode,function", [(Mode.MODE_REQUIRED, ""), (Mode.MODE_FUNCTION, "get_time")])
def test_a_required_call_streams_and_its_arguments_validate(chat_server, mode: int, function: str) -> None:  # type: ignore[no-untyped-def]
    request = pb.GenerateOnceRequest(config=_config(mode, function),
                                     input=_user("What is the weather in Oslo, in celsius?"))
    with grpc.insecure_channel(chat_server.address) as channel:
        responses = list(pb_grpc.LLMServiceStub(channel).GenerateOnce(request, timeout=300))
    text, calls, end = _turn(responses)
    assert text == "" and len(end.tool_calls) == 1
    _validated(end, calls)
    if function:
        assert end.tool_calls[0].name == "get_time"


def test_auto_answers_or_calls_and_parallel_calls_are_unique(chat_server) -> None:  # type: ignore[no-untyped-def]
    """`auto` may take either branch, each checked in full; beside it the same prompt is
    pinned: MODE_NONE must answer in text (no call can form), MODE_FUNCTION must call."""
    hello = _user("Say hello.")
    with grpc.insecure_channel(chat_server.address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        def sample(config: pb.SessionConfig) -> pb.GenerateTextResponse.Sample:
            return stub.GenerateText(pb.GenerateTextRequest(config=config, input=hello), timeout=300).samples[0]

        auto = sample(_config(Mode.MODE_AUTO))
        none = sample(_config(Mode.MODE_NONE, max_tokens=40))  # a text answer need not end soon
        named = sample(_config(Mode.MODE_FUNCTION, "get_weather"))
        several = stub.GenerateText(pb.GenerateTextRequest(config=_config(Mode.MODE_REQUIRED, parallel=True),
                                                           input=_user("Weather in Oslo and time in UTC?")),
                                    timeout=300).samples[0]
    if auto.turn_end.tool_calls:  # the model chose a call: no text beside it, arguments that validate
        assert auto.text == "" and auto.turn_end.finish_reason == pb.FinishReason.FINISH_REASON_TOOL_CALLS
        assert len(auto.turn_end.tool_calls) == 1
        for call in auto.turn_end.tool_calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    else:
        assert auto.turn_end.finish_reason == pb.FinishReason.FINISH_REASON_STOP, auto.turn_end
        assert auto.text and not auto.text.lstrip().startswith('{"response"'), auto.text  # the answer, unwrapped
    assert none.text and not none.turn_end.tool_calls, none
    assert none.turn_end.finish_reason in (pb.FinishReason.FINISH_REASON_STOP, pb.FinishReason.FINISH_REASON_LENGTH)
    assert named.text == "" and [c.name for c in named.turn_end.tool_calls] == ["get_weather"], named
    assert named.turn_end.finish_reason == pb.FinishReason.FINISH_REASON_TOOL_CALLS
    jsonschema.validate(json.loads(named.turn_end.tool_calls[0].arguments), SCHEMAS["get_weather"])
    assert 1 <= len(several.turn_end.tool_calls) <= MAX_PARALLEL_CALLS
    assert len({c.id for c in several.turn_end.tool_calls}) == len(several.turn_end.tool_calls)
    for call in several.turn_end.tool_calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_a_call_its_result_and_the_answer_in_one_session(chat_server) -> None:  # type: ignore[no-untyped-def]
    """Turn 1 must call get_weather; turn 2 sends its result as a `tool` message (rendered
    in the generic format) and, as the session's tool_choice still asks for a call, gets a
    valid call again, on top of turn 1's KV (the call the model wrote is in the history)."""
    outbox: queue.Queue[pb.GenerateRequest | None] = queue.Queue()
    outbox.put(pb.GenerateRequest(config=_config(Mode.MODE_FUNCTION, "get_weather"),
                                  input=_user("What is the weather in Oslo, in celsius?"), end_of_turn=True))
    with grpc.insecure_channel(chat_server.address) as channel:
        call = pb_grpc.LLMServiceStub(channel).Generate(iter(outbox.get, None), timeout=300)
        responses = []
        for r in call:
            responses.append(r)
            if r.HasField("turn_end"):
                break
        _, calls, end = _turn(responses)
        _validated(end, calls)
        result = pb.ChatMessage(role="tool", tool_call_id=end.tool_calls[0].id, content='{"temperature": 12}')
        outbox.put(pb.GenerateRequest(input=pb.Input(messages=pb.ChatMessages(messages=[result])), end_of_turn=True))
        outbox.put(None)
        second = list(call)
    _, calls2, end2 = _turn(second)
    _validated(end2, calls2)
    assert end2.tool_calls[0].id != end.tool_calls[0].id
    assert end2.usage.cached_tokens >= end.usage.prompt_tokens  # turn 1's prompt and reply stay in the KV


@pytest.mark.parametrize("config,field", [
    (pb.SessionConfig(tools=[pb.Tool(name="bad name")]), "config.tools[0].name"),
    (pb.SessionConfig(tools=[WEATHER], tool_choice=pb.ToolChoice(mode=Mode.MODE_FUNCTION, function_name="nope")),
     "config.tool_choice"),
    (pb.SessionConfig(tools=[pb.Tool(name="f", parameters="[1]")]), "config.tools[0].parameters"),
    (pb.SessionConfig(tools=[WEATHER], constraint=pb.Constraint(regex="a+")), "config.constraint.regex"),
    (pb.SessionConfig(tool_choice=pb.ToolChoice(mode=Mode.MODE_REQUIRED)), "config.tool_choice"),
])
def test_refusals_name_the_field(chat_server, config: pb.SessionConfig, field: str) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(chat_server.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.LLMServiceStub(channel).GenerateText(pb.GenerateTextRequest(config=config, input=_user("Hi")),
                                                         timeout=60)
    status = rpc_status.from_call(refused.value)  # type: ignore[arg-type]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and status is not None
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in status.details) and bad.field_violations[0].field == field, status

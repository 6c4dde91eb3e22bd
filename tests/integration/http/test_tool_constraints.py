"""Tools are constraints (issue 39 §2), on both surfaces of one real server: a tool's
parameters keep every bound a response_format schema keeps, and with `strict` (HTTP
`function.strict`, gRPC `Tool.strict`) what the converter would drop is refused. Each
hostile schema is refused quickly, naming the tool's parameters, whether strict or not
(on main at 725c320 an unsatisfiable one was served, a deep one took 21 s, a huge
minItems crashed the grammar worker; a huge enum or an empty repeat in a pattern made
each decode step take seconds to minutes). Also: one tool's `$ref`s never reach another
document's definitions, wrong-typed tool fields are refused by name, and
`response_format` refuses keys its type does not take."""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
import jsonschema
import openai
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI

from harness.server import RunningServer
from tests.integration.http.conftest import API_KEY

QUICK_S = 5.0  # each refusal is in-process checks, or one small compile; a served one ran for minutes
QUESTION = [{"role": "user", "content": "Call the tool."}]
AUTH = (("authorization", f"Bearer {API_KEY}"),)  # the server runs with --api-key, gRPC too


def _object(properties: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {**schema, "$defs": defs} if defs else schema




def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"d": schema}}
    return schema


ENDLESS = {"$defs": {"Node": _object({"children": {"type": "array", "items": {"$ref": "#/$defs/Node"},
                                                   "minItems": 1}})}, "$ref": "#/$defs/Node"}
HOSTILE = {
    "unsatisfiable": (_object({"n": {"type": "integer", "minimum": 5, "maximum": 4}}), "no value satisfies"),
    "recursive": (ENDLESS, "no finite instance"),
    "huge_enum": (_object({"v": {"enum": list(range(5000))}}), "limited to 256"),
    "huge_min_items": (_object({"a": {"type": "array", "items": {"type": "integer"}, "minItems": 10**8}}),
                       "limited to 1000"),
    "deep": (_deep(300), "nests deeper than 64"),  # HTTP: 110 (the body's own nesting is bounded at 256)
    "empty_repeat_pattern": (_object({"p": {"type": "string", "pattern": "^([a-z]{0,3}){0,20}$"}}),
                             "can match nothing"),
}


def _http_refusal(client: OpenAI, model: str, tools: list[Any], **kwargs: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        client.with_options(timeout=60).chat.completions.create(
            model=model, messages=kwargs.pop("messages", QUESTION), tools=tools, max_tokens=4, **kwargs)
    return caught.value


def _grpc_refusal(address: str, config: pb.SessionConfig) -> tuple[str, str]:
    """The INVALID_ARGUMENT's BadRequest field and its message."""
    request = pb.GenerateTextRequest(config=config, input=pb.Input(messages=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="Call the tool.")])))
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.LLMServiceStub(channel).GenerateText(request, timeout=60, metadata=AUTH)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    status = rpc_status.from_call(caught.value)  # type: ignore[arg-type]
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in status.details), status
    return bad.field_violations[0].field, caught.value.details() or ""


def _function(name: str, parameters: dict[str, Any], strict: bool | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    return {"type": "function", "function": function if strict is None else {**function, "strict": strict}}


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize("strict", [False, True])
def test_a_hostile_tool_schema_is_refused_quickly_over_http(client: OpenAI, model: str, case: str,
                                                            strict: bool) -> None:
    parameters, said = HOSTILE[case] if case != "deep" else (_deep(110), HOSTILE[case][1])
    started = time.monotonic()
    refused = _http_refusal(client, model, [_function("f", parameters, strict)])
    elapsed = time.monotonic() - started
    assert refused.param == "tools[0].function.parameters" and said in refused.message, refused
    assert elapsed < QUICK_S, f"{case}: refused after {elapsed:.1f} s"


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize("strict", [False, True])
def test_a_hostile_tool_schema_is_refused_quickly_over_grpc(http_server: RunningServer, case: str,
                                                            strict: bool) -> None:
    parameters, said = HOSTILE[case]
    config = pb.SessionConfig(stopping=pb.StoppingCriteria(max_tokens=4), tool_choice=pb.ToolChoice(
        mode=pb.ToolChoice.MODE_FUNCTION, function_name="f"), tools=[
        pb.Tool(name="tiny", parameters="{}"), pb.Tool(name="f", parameters=json.dumps(parameters), **({"strict": True} if strict else {}))])
    started = time.monotonic()
    field, message = _grpc_refusal(http_server.address, config)
    elapsed = time.monotonic() - started
    assert field == "config.tools[1].parameters" and said in message, message
    assert elapsed < QUICK_S, f"{case}: refused after {elapsed:.1f} s"


PERSON = _object({"age": {"type": "integer", "minimum": 0, "maximum": 120}})


def test_strict_refuses_what_the_converter_drops_on_both_surfaces(client: OpenAI, model: str,
                                                                  http_server: RunningServer) -> None:
    refused = _http_refusal(client, model, [_function("person", PERSON, strict=True)])
    assert refused.param == "tools[0].function.parameters", refused
    assert "`minimum` at /properties/age/minimum" in refused.message, refused.message
    config = pb.SessionConfig(tools=[pb.Tool(name="person", parameters=json.dumps(PERSON), strict=True)])
    field, message = _grpc_refusal(http_server.address, config)
    assert field == "config.tools[0].parameters" and "`minimum` at /properties/age/minimum" in message, message


def test_all_tools_together_are_bounded_quickly(client: OpenAI, model: str, http_server: RunningServer) -> None:
    """128 tools of 4 KB (within one tool's bound) beside a tiny one named: refused before
    any is parsed (on main the 512 KB preamble was built and rendered first)."""
    big = _object({"e": {"enum": [f"{i:04d}" + "x" * 56 for i in range(60)]}})
    tools = [_function("tiny", {}), *(_function(f"t{i}", big) for i in range(127))]
    started = time.monotonic()
    refused = _http_refusal(client, model, tools, tool_choice={"type": "function", "function": {"name": "tiny"}})
    assert refused.param == "tools" and "in all" in refused.message, refused
    config = pb.SessionConfig(tools=[pb.Tool(name=t["function"]["name"], parameters=json.dumps(
        t["function"]["parameters"])) for t in tools], tool_choice=pb.ToolChoice(
        mode=pb.ToolChoice.MODE_FUNCTION, function_name="tiny"))
    field, message = _grpc_refusal(http_server.address, config)
    assert field == "config.tools" and "in all" in message, message
    assert time.monotonic() - started < 2 * QUICK_S


@pytest.mark.parametrize(("function", "param"), [
    ({"name": "f", "parameters": False}, "tools[0].function.parameters"),
    ({"name": "f", "parameters": []}, "tools[0].function.parameters"),
    ({"name": "f", "description": 0}, "tools[0].function.description"),
    ({"name": "f", "description": False}, "tools[0].function.description"),
    ({"name": "f", "strict": "yes"}, "tools[0].function.strict"),
    ({"name": "f", "strict": 1}, "tools[0].function.strict"),
    ({"name": 7}, "tools[0].function.name"),
])
def test_a_wrong_typed_tool_field_is_refused_by_name(client: OpenAI, model: str, function: dict[str, Any],
                                                     param: str) -> None:
    refused = _http_refusal(client, model, [{"type": "function", "function": function}])
    assert refused.param == param, refused


@pytest.mark.parametrize(("response_format", "param"), [
    ({"type": "text", "json_schema": {"name": "x", "schema": {"type": "object"}}}, "response_format.json_schema"),
    ({"type": "json_object", "json_schema": {"name": "x", "schema": {}}}, "response_format.json_schema"),
    ({"type": "json_object", "schema": {"type": "object"}}, "response_format.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}, "strict": True}, "response_format.strict"),
])
def test_response_format_refuses_keys_its_type_does_not_take(client: OpenAI, model: str,
                                                             response_format: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4,  # type: ignore[call-overload]
                                       response_format=response_format)
    assert caught.value.param == param, caught.value


# x's def `y__z` and x__y's def `z` were both hoisted as `x__y__z` (the last one won)
A = _object({"a": {"const": "A"}})
B = _object({"b": {"const": "B"}})
X = _object({"v": {"$ref": "#/$defs/y__z"}}, {"y__z": A})
X_Y = _object({"v": {"$ref": "#/$defs/z"}}, {"z": B})


def test_a_tools_refs_resolve_to_its_own_definitions_over_http(client: OpenAI, model: str) -> None:
    """Both tools in the reply schema (required): the call's arguments follow its own tool."""
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Call x."}],
                                           max_tokens=60, temperature=0, tool_choice="required",
                                           tools=[_function("x", X), _function("x__y", X_Y)])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), {"x": X, "x__y": X_Y}[call.function.name])


def test_a_tools_refs_resolve_to_its_own_definitions_over_grpc(http_server: RunningServer) -> None:
    """A tool named `response` whose def is named as the answer schema's (both were hoisted
    under `response__`), beside x and x__y: a call or the answer, each follows its own schema."""
    answer = _object({"v": {"$ref": "#/$defs/D"}}, {"D": B})
    tools = [pb.Tool(name="response", parameters=json.dumps(_object({"v": {"$ref": "#/$defs/D"}}, {"D": A}))),
             pb.Tool(name="x", parameters=json.dumps(X)), pb.Tool(name="x__y", parameters=json.dumps(X_Y))]
    schemas = {t.name: json.loads(t.parameters) for t in tools}
    config = pb.SessionConfig(sampling=pb.SamplingParams(temperature=0.0), stopping=pb.StoppingCriteria(
        max_tokens=60), tools=tools, constraint=pb.Constraint(json_schema=json.dumps(answer)),
        tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_AUTO))
    request = pb.GenerateTextRequest(config=config, input=pb.Input(messages=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content="Call the tool named response.")])))
    with grpc.insecure_channel(http_server.address) as channel:
        sample = pb_grpc.LLMServiceStub(channel).GenerateText(request, timeout=300, metadata=AUTH).samples[0]
    if sample.turn_end.finish_reason == pb.FinishReason.FINISH_REASON_TOOL_CALLS:
        for call in sample.turn_end.tool_calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    else:
        assert sample.turn_end.finish_reason == pb.FinishReason.FINISH_REASON_STOP, sample
        jsonschema.validate(json.loads(sample.text), answer)

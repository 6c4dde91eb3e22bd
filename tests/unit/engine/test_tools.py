"""Tool calling's generic format (engine/chat/tools.py): the reply schema, what the grammar
converter makes of it, parsing whole replies (engine/chat/tool_reply.py; streamed ones in
test_tool_reply.py), and tool messages for templates without tools."""

from __future__ import annotations

import json

import jsonschema
import pytest
from llmserve.service.domain.errors import Field, InvalidRequest
from llmserve.service.domain.events import ToolCall
from llmserve.service.engine.chat.chat import ChatMessage
from llmserve.service.engine.chat.tool_messages import as_generic_messages
from llmserve.service.engine.chat.tool_plan import plan_tools, with_preamble
from llmserve.service.engine.chat.tool_reply import parse_reply
from llmserve.service.engine.chat.tools import Tool, ToolChoice, check_tools, preamble, reply_schema

WEATHER = Tool("get_weather", "The weather in a city", json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}))
TIME = Tool("get_time", "The time in a zone", json.dumps({"type": "object", "properties": {"zone": {"type": "string"}}}))
TOOLS = (WEATHER, TIME)


def test_tools_and_choices_are_checked_by_field() -> None:
    check_tools(TOOLS, ToolChoice("function", "get_time"))
    cases = [
        ((Tool("bad name"),), ToolChoice(), "tools[0].name"),
        ((WEATHER, WEATHER), ToolChoice(), "tools[1].name"),
        ((Tool("f", parameters="[1]"),), ToolChoice(), "tools[0].parameters"),
        ((Tool("f", parameters="{"),), ToolChoice(), "tools[0].parameters"),
        (TOOLS, ToolChoice("function", "nope"), "tool_choice"),
        ((), ToolChoice("required"), "tool_choice"),
        (TOOLS, ToolChoice("sometimes"), "tool_choice"),
    ]
    for tools, choice, field in cases:
        with pytest.raises(InvalidRequest) as refused:
            check_tools(tools, choice)
        assert refused.value.field == field, (tools, choice)


def test_the_schema_admits_calls_with_valid_arguments_only() -> None:
    schema = reply_schema(TOOLS, ToolChoice("auto"))
    assert schema is not None
    jsonschema.validate({"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, schema)
    jsonschema.validate({"response": "Hello."}, schema)
    for wrong in ({"tool_call": {"name": "get_weather", "arguments": {"days": 2}}},  # city is required
                  {"tool_call": {"name": "launch", "arguments": {}}}, {"text": "hi"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


def test_required_named_and_parallel_shapes() -> None:
    required = reply_schema(TOOLS, ToolChoice("required"))
    assert required is not None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"response": "no call"}, required)
    named = reply_schema(TOOLS, ToolChoice("function", "get_time"))
    assert named is not None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_call": {"name": "get_weather", "arguments": {"city": "x"}}}, named)
    parallel = reply_schema(TOOLS, ToolChoice("required"), parallel=True)
    assert parallel is not None
    jsonschema.validate({"tool_calls": [{"name": "get_time", "arguments": {}},
                                        {"name": "get_weather", "arguments": {"city": "Rome"}}]}, parallel)
    assert reply_schema(TOOLS, ToolChoice("none")) is None and reply_schema((), ToolChoice("auto")) is None


def test_the_grammar_converter_takes_the_schema() -> None:
    from llmserve.service.model.grammar_sources import to_gbnf  # what the grammar worker runs

    gbnf = to_gbnf("json_schema", json.dumps(reply_schema(TOOLS, ToolChoice("auto"), parallel=True)))
    assert "root ::=" in gbnf and '\\"get_weather\\"' in gbnf and '\\"response\\"' in gbnf


def test_replies_parse_into_calls_or_text() -> None:
    one = parse_reply('{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}')
    assert one.content is None and [(c.name, json.loads(c.arguments)) for c in one.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]
    two = parse_reply('{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]}')
    assert len(two.tool_calls) == 2 and two.tool_calls[0].id != two.tool_calls[1].id
    assert all(c.id.startswith("call_") for c in two.tool_calls)
    assert parse_reply('{"response": "Sunny."}').content == "Sunny."
    cut = parse_reply('{"tool_call": {"name": "get_weather", "arguments": {"ci')  # cut short: no call
    assert cut.tool_calls == () and cut.content == ""
    assert parse_reply('{"response": "Sun') == parse_reply('{"response": "Sun"}')  # an answer cut short: its text
    assert parse_reply("plain words").content == "plain words"  # not the format (no grammar held it)
    raw = '{"tool_call": {"name": "get_time", "arguments": { "zone" : "UTC" }}}'
    assert parse_reply(raw).tool_calls[0].arguments == '{ "zone" : "UTC" }'  # as the model wrote it


def test_the_preamble_names_every_tool_and_the_format() -> None:
    schema = reply_schema(TOOLS, ToolChoice("auto"))
    assert schema is not None
    text = preamble(TOOLS, schema)
    assert "get_weather" in text and "get_time" in text and "`tool_call`" in text and "`response`" in text


def test_tool_messages_become_plain_messages() -> None:
    calls = (ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)
    plain = as_generic_messages([
        ChatMessage("user", "Weather in Oslo?"),
        ChatMessage("assistant", "", calls),
        ChatMessage("tool", "12 C, rain", tool_call_id="call_1"),
    ])
    assert [m.role for m in plain] == ["user", "assistant", "user"]
    assert json.loads(plain[1].content) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    assert json.loads(plain[2].content)["tool_response"] == {"tool_call_id": "call_1", "content": "12 C, rain"}
    with pytest.raises(InvalidRequest) as refused:
        as_generic_messages([ChatMessage("assistant", "", (ToolCall("c", "f", "{not json"),))])
    assert refused.value.field == Field.MESSAGES.at(0, "tool_calls[0].arguments")


def test_a_plan_puts_its_preamble_after_the_system_text() -> None:
    plan = plan_tools(TOOLS, ToolChoice("auto"), parallel=False)
    assert plan.active and not plan_tools(TOOLS, ToolChoice("none"), parallel=False).active
    messages = with_preamble([ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")], plan)
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content.startswith("Be brief.\n\n") and "get_weather" in messages[0].content
    assert with_preamble([ChatMessage("user", "Hi")], plan)[0].role == "system"


def test_refs_in_parameters_and_answers_follow_them_into_the_reply_schema() -> None:
    """A pydantic model's schema refers into its own `$defs` (and `#` to itself): inside the
    reply schema those refs must still find their targets."""
    node = {"type": "object", "properties": {"label": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["label"]}
    order = {"$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}},
             "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
             "required": ["items"]}
    tools = (Tool("tree", parameters=json.dumps(node)), Tool("order", parameters=json.dumps(order)))
    schema = reply_schema(tools, ToolChoice("auto"), parallel=True, response=order)
    assert schema is not None
    jsonschema.validate({"tool_calls": [
        {"name": "tree", "arguments": {"label": "a", "children": [{"label": "b", "children": []}]}},
        {"name": "order", "arguments": {"items": [{"sku": "x1"}]}}]}, schema)
    jsonschema.validate({"response": {"items": [{"sku": "y"}]}}, schema)
    for wrong in ({"tool_calls": [{"name": "tree", "arguments": {"label": "a", "children": [{"no": 1}]}}]},
                  {"tool_calls": [{"name": "order", "arguments": {"items": [{"id": 3}]}}]},
                  {"response": {"items": [{}]}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    from llmserve.service.model.grammar_sources import to_gbnf  # what the grammar worker runs

    assert "root ::=" in to_gbnf("json_schema", json.dumps(schema))


def _object(properties: dict[str, object], defs: dict[str, object] | None = None) -> dict[str, object]:
    schema: dict[str, object] = {"type": "object", "properties": properties, "required": list(properties),
                                 "additionalProperties": False}
    return {**schema, "$defs": defs} if defs else schema


A = _object({"a": {"const": "A"}})
B = _object({"b": {"const": "B"}})


@pytest.mark.parametrize(("tools", "response"), [
    # x's def `y__z` and x__y's def `z` were both hoisted as `x__y__z`
    ((Tool("x", parameters=json.dumps(_object({"v": {"$ref": "#/$defs/y__z"}}, {"y__z": A}))),
      Tool("x__y", parameters=json.dumps(_object({"v": {"$ref": "#/$defs/z"}}, {"z": B})))), None),
    # a tool named `response` and the answer's schema were both hoisted under `response__`
    ((Tool("response", parameters=json.dumps(_object({"v": {"$ref": "#/$defs/D"}}, {"D": A}))),),
     _object({"v": {"$ref": "#/$defs/D"}}, {"D": B})),
])
def test_one_documents_refs_never_reach_anothers_definitions(tools: tuple[Tool, ...],
                                                            response: dict[str, object] | None) -> None:
    schema = reply_schema(tools, ToolChoice("auto"), parallel=True, response=response)
    assert schema is not None
    for tool in tools:
        own = json.loads(tool.parameters)["$defs"]
        good, bad = ({"v": {"a": "A"}}, {"v": {"b": "B"}}) if own == {k: A for k in own} else (
            {"v": {"b": "B"}}, {"v": {"a": "A"}})
        jsonschema.validate({"tool_calls": [{"name": tool.name, "arguments": good}]}, schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"tool_calls": [{"name": tool.name, "arguments": bad}]}, schema)
    if response is not None:
        jsonschema.validate({"response": {"v": {"b": "B"}}}, schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"response": {"v": {"a": "A"}}}, schema)
    from llmserve.service.model.grammar_sources import to_gbnf  # what the grammar worker runs

    assert "root ::=" in to_gbnf("json_schema", json.dumps(schema))


DEEP: dict[str, object] = {"type": "object"}
for _ in range(300):
    DEEP = {"type": "object", "properties": {"d": DEEP}}


@pytest.mark.parametrize(("parameters", "said"), [
    (_object({"n": {"type": "integer", "minimum": 5, "maximum": 4}}), "no value satisfies"),
    (_object({"n": {"type": "number", "exclusiveMinimum": 4, "maximum": 4}}), "no value satisfies"),
    (_object({"n": {"type": "integer", "minimum": 4.2, "maximum": 4.8}}), "no value satisfies"),
    (_object({"s": {"type": "string", "minLength": 3, "maxLength": 2}}), "no value satisfies"),
    (_object({"e": {"enum": []}}), "no value satisfies"),
    (_object({"e": {"enum": list(range(5000))}}), "limited to 256"),
    (_object({"e": {"anyOf": [{"const": i} for i in range(300)]}}), "limited to 256"),
    (_object({"a": {"type": "array", "items": {"type": "integer"}, "minItems": 1e8}}), "limited to 1000"),
    (DEEP, "nests deeper than 64"),
    (_object({"p": {"type": "string", "pattern": "^([a-z]{0,3}){0,20}$"}}), "can match nothing"),
    (_object({"p": {"type": "string", "pattern": "^(a*)+$"}}), "can match nothing"),
])
@pytest.mark.parametrize("strict", [False, True])
def test_a_tools_parameters_keep_every_schemas_bounds(parameters: dict[str, object], said: str, strict: bool) -> None:
    tools = (WEATHER, Tool("bad", parameters=json.dumps(parameters), strict=strict))
    with pytest.raises(InvalidRequest) as refused:
        check_tools(tools, ToolChoice("auto"))
    assert refused.value.field == "tools[1].parameters" and said in str(refused.value), refused.value


def test_strict_refuses_what_the_converter_drops_and_the_rest_is_served() -> None:
    person = _object({"age": {"type": "integer", "minimum": 0, "maximum": 120}})
    check_tools((Tool("p", parameters=json.dumps(person)),), ToolChoice("auto"))  # served as the converter reads it
    with pytest.raises(InvalidRequest) as refused:
        check_tools((Tool("p", parameters=json.dumps(person), strict=True),), ToolChoice("auto"))
    assert refused.value.field == "tools[0].parameters" and "`minimum` at /properties/age/minimum" in str(refused.value)
    satisfiable = [_object({"n": {"type": "integer", "minimum": 4, "maximum": 4}}),
                   _object({"n": {"minimum": 5, "maximum": 4}}),  # no type: a string satisfies it
                   _object({"p": {"type": "string", "pattern": "^([a-z]{1,3}){0,20}$"}}),
                   _object({"e": {"const": {"enum": [], "minimum": 5, "maximum": 4}}})]  # a value, not a schema
    check_tools(tuple(Tool(f"t{i}", parameters=json.dumps(s)) for i, s in enumerate(satisfiable)), ToolChoice("auto"))


def test_all_tools_together_are_bounded_before_any_is_parsed() -> None:
    big = json.dumps(_object({"e": {"enum": ["x" * 60] * 200}}))  # 13 KB each, within one tool's bound
    tools = tuple(Tool(f"t{i}", parameters=big) for i in range(40))
    with pytest.raises(InvalidRequest) as refused:
        check_tools(tools, ToolChoice("function", "t0"))
    assert refused.value.field == "tools" and "in all" in str(refused.value)


def test_a_refusal_of_the_compiled_reply_names_the_one_tool_it_holds() -> None:
    assert plan_tools(TOOLS, ToolChoice("function", "get_time"), parallel=False).field == "tools[1].parameters"
    assert plan_tools(TOOLS[:1], ToolChoice("auto"), parallel=False).field == "tools[0].parameters"
    assert plan_tools(TOOLS, ToolChoice("auto"), parallel=False).field == "tools"
    assert plan_tools(TOOLS[:1], ToolChoice("auto"), False, {"type": "object"}).field == "tools"


def test_a_list_of_types_is_read_as_admitting_more() -> None:
    """`minimum` above `maximum` beside `["integer", "null"]`: null satisfies it."""
    schema = _object({"n": {"type": ["integer", "null"], "minimum": 5, "maximum": 4, "maxLength": 1}})
    check_tools((Tool("n", parameters=json.dumps(schema)),), ToolChoice("auto"))


def test_counts_no_grammar_holds_are_left_out_of_a_tool_that_is_not_strict() -> None:
    """Claude Code's tools limit strings to 524,288 characters: served unenforced unless `strict`."""
    big = {"type": "object", "properties": {"script": {"type": "string", "maxLength": 524288, "minLength": 1},
                                            "lines": {"type": "array", "maxItems": 5000}}}
    plan = plan_tools([Tool("run", "", json.dumps(big))], ToolChoice("required"), False)
    loosened = json.loads(plan.tools[0].parameters)
    assert loosened["properties"]["script"] == {"type": "string", "minLength": 1}
    assert loosened["properties"]["lines"] == {"type": "array"}
    assert "524288" not in json.dumps(plan.schema)
    with pytest.raises(InvalidRequest) as refused:
        plan_tools([Tool("run", "", json.dumps(big), strict=True)], ToolChoice("required"), False)
    assert refused.value.field == "tools[0].parameters" and "1000" in str(refused.value)
    huge_minimum = {"type": "object", "properties": {"s": {"type": "string", "minLength": 5000}}}
    with pytest.raises(InvalidRequest):  # a lower bound no reply could meet stays refused
        plan_tools([Tool("run", "", json.dumps(huge_minimum))], ToolChoice("required"), False)


def test_a_tool_nested_past_the_bound_is_refused_not_a_crash() -> None:
    deep: dict[str, object] = {"type": "object"}
    for _ in range(400):  # past the depth Python's recursion would take in loosening it
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(InvalidRequest) as refused:
        plan_tools([Tool("f", "", json.dumps(deep))], ToolChoice("required"), False)
    assert "deeper" in str(refused.value)

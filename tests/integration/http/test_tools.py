"""Tool calling on /v1/chat/completions (the generic format) through the `openai` SDK, against
the real model: whatever the model picks, a call's arguments validate against its
function's schema, and the streamed deltas reassemble to the same call shape."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME_PARAMETERS = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a time zone",
                                      "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
QUESTION = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]


def _create(client: OpenAI, model: str, messages: list[Any] = QUESTION, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0,
                                          max_tokens=320, **kwargs)


def _check_calls(calls: list[Any]) -> None:
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_gives_a_call_whose_arguments_validate(client: OpenAI, model: str) -> None:
    choice = _create(client, model, tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    assert len(choice.message.tool_calls) == 1
    _check_calls(choice.message.tool_calls)


def test_a_named_function_is_the_one_called(client: OpenAI, model: str) -> None:
    choice = _create(client, model, tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    _check_calls(choice.message.tool_calls)


HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


def _check_answer(choice: Any, finishes: tuple[str, ...] = ("stop",)) -> None:
    assert not choice.message.tool_calls and choice.finish_reason in finishes, choice
    assert isinstance(choice.message.content, str) and choice.message.content, choice
    assert not choice.message.content.lstrip().startswith('{"response"'), choice  # the answer, unwrapped


def test_auto_gives_a_call_or_an_answer_and_each_choice_beside_it_is_pinned(client: OpenAI, model: str) -> None:
    """`auto` may take either branch, and each is checked in full (a call's arguments
    validate, an answer is plain text); beside it the same prompts pin the branch: a named
    function must give that call, `none` must give text."""
    for messages in (QUESTION, HELLO):
        choice = _create(client, model, messages, tool_choice="auto").choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
            assert len(choice.message.tool_calls) == 1  # parallel_tool_calls is off by default
            _check_calls(choice.message.tool_calls)
        else:
            _check_answer(choice)
    named = _create(client, model, HELLO, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].finish_reason == "tool_calls" and named.choices[0].message.content is None, named
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_weather"]
    _check_calls(named.choices[0].message.tool_calls)
    plain = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=40)  # no grammar: a text answer need not end
    _check_answer(plain.choices[0], ("stop", "length"))


BOOKING = {"type": "object", "additionalProperties": False, "required": ["code", "guests", "seat", "nights"],
           "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                          "guests": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 12},
                                     "minItems": 1, "maxItems": 3},
                          "seat": {"anyOf": [{"type": "null"}, {"enum": ["aisle", "window"]}]},
                          "nights": {"type": "integer"}}}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_strict_tools_arguments_validate_against_every_keyword(client: OpenAI, model: str, seed: int) -> None:
    """`strict` is what makes "a call's arguments validate" a promise (a keyword the converter
    would drop is refused: test_tool_constraints.py): here every keyword the converter does
    enforce, sampled, so that a wrong enforcement would show."""
    tools = [{"type": "function", "function": {"name": "book", "parameters": BOOKING, "strict": True}}]
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Book two nights for Ann and Bo, flight ABC-123."}],
        tools=tools, tool_choice="required", temperature=0.9, seed=seed, max_tokens=200)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice  # every part of the schema is bounded: it ends
    jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), BOOKING)


def test_parallel_calls_parse_with_unique_ids(client: OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "What is the weather in Oslo, and the time in UTC?"}]
    choice = _create(client, model, messages, tool_choice="required", parallel_tool_calls=True).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert 1 <= len(choice.message.tool_calls) <= 8  # MAX_PARALLEL_CALLS
    _check_calls(choice.message.tool_calls)


def test_a_round_trip_ends_in_an_answer(client: OpenAI, model: str) -> None:
    first = _create(client, model, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = first.choices[0].message
    call = message.tool_calls[0]
    messages = [*QUESTION, message,  # the SDK's own reply object goes back as it came
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    final = _create(client, model, messages, tool_choice="none").choices[0]
    assert isinstance(final.message.content, str) and final.message.content, final
    assert not final.message.tool_calls and final.finish_reason in ("stop", "length")


def test_streamed_calls_reassemble_to_the_whole_shape(client: OpenAI, model: str) -> None:
    kwargs = {"tool_choice": "required"}
    _create(client, model, **kwargs)  # warms the prefix cache: the two compared calls run alike
    whole = _create(client, model, **kwargs).choices[0]
    chunks = list(_create(client, model, stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict[str, str]] = {}
    num_fragments = 0
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.id is not None:  # a call's head: its index, id, type and name come first
                assert delta.index not in calls and delta.type == "function" and delta.function.name
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            else:
                num_fragments += 1
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert num_fragments > len(calls), "the arguments stream as they form, not whole at the end"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_logprobs_beside_tools_are_served_as_over_grpc(client: OpenAI, model: str) -> None:
    """One rule for both surfaces (engine/chat/tools.py `ToolPlan`): they are the reply's sampled tokens'."""
    called = _create(client, model, tool_choice="required", logprobs=True).choices[0]
    assert called.finish_reason == "tool_calls", called
    _check_calls(called.message.tool_calls)
    answer = _create(client, model, HELLO, tool_choice="auto", logprobs=True, top_logprobs=2).choices[0]
    if answer.finish_reason != "tool_calls":
        assert answer.logprobs is not None and answer.logprobs.content, answer
        assert all(len(entry.top_logprobs) == 2 for entry in answer.logprobs.content)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function.parameters"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"extra_body": {"regex": "a+"}}, "regex"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [*QUESTION, {"role": "tool", "content": "21"}]}, "messages[1].tool_call_id"),
    ({"messages": [*QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_refused_by_name(client: OpenAI, model: str, kwargs: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"tools": TOOLS, "messages": QUESTION, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, **body)
    assert caught.value.param == param, caught.value

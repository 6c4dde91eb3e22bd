"""OpenAI Responses (`POST /v1/responses`) through the official `openai` SDK against the real
server and model: whole and streamed replies (the SDK's own accumulation checks the event
order and ids), instructions, a function call and its output on the next request,
`text.format` json_schema through `responses.parse`, the usage's cached tokens, and
refusals naming the field."""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}


class Colour(BaseModel):
    name: str


def test_a_whole_response(client: OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Name a colour.", instructions="You are terse.",
                                       max_output_tokens=8)
    assert response.object == "response" and response.model == model and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.output_text
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert 1 <= response.usage.output_tokens <= 8 and response.usage.input_tokens > 10
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_the_stream_accumulates_to_the_whole_response(client: OpenAI, model: str) -> None:
    kinds, numbers, text = [], [], ""
    with client.responses.stream(model=model, input="Count: one, two, three,", max_output_tokens=12,
                                 temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            text += event.delta if event.type == "response.output_text.delta" else ""
            if event.type == "response.incomplete":  # terminal, as response.completed (the SDK keeps only that one)
                final = event.response
    assert final.output_text == text
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert numbers == list(range(len(numbers)))
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert final.status == "incomplete" and final.usage.output_tokens == 12 and text
    again = client.responses.create(model=model, input="Count: one, two, three,", max_output_tokens=12, temperature=0)
    assert again.usage.input_tokens == final.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens > 0  # the same prompt: its prefix was cached


def test_a_function_call_and_its_output(client: OpenAI, model: str) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.responses.create(model=model, input=ask, tools=[WEATHER], temperature=0,
                                       tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    follow = client.responses.create(model=model, tools=[WEATHER], max_output_tokens=16, input=[
        *ask, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_streamed_function_call_arguments(client: OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input="Weather in Rome?", tools=[WEATHER], tool_choice="required",
                                 temperature=0, max_output_tokens=64) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert "".join(deltas) == call.arguments and json.loads(call.arguments)["city"]


def test_parse_holds_the_reply_to_the_schema(client: OpenAI, model: str) -> None:
    parsed = client.responses.parse(model=model, input="Name a colour.", text_format=Colour, max_output_tokens=32,
                                    temperature=0)
    assert isinstance(parsed.output_parsed, Colour) and parsed.output_parsed.name


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_x"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].type"),
])
def test_what_is_not_served_is_refused_by_name(client: OpenAI, model: str, extra: dict[str, object], param: str) -> None:
    body = {"input": "hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, **body)  # type: ignore[arg-type]
    assert refused.value.body["param"] == param

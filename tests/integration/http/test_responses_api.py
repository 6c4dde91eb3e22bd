"""OpenAI Responses (`POST /v1/responses`) through the official `openai` SDK against the real
server and model: whole and streamed replies (the SDK's own accumulation checks the event
order and ids), instructions, a function call and its output on the next request,
`text.format` json_schema through `responses.parse`, the usage's cached tokens, logprobs,
and refusals naming the field."""

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
    assert isinstance(parsed.output_parsed, Colour) and isinstance(parsed.output_parsed.name, str)


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_never_stored"}, "previous_response_id"),
    ({"background": True, "store": False}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"max_output_tokens": 10**7}, "max_output_tokens"),  # chat's rules check it: named as this body spells it
    ({"text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "string", "pattern": "^a{1,1000000}$"}}}},
     "text.format.schema"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0].type"),
])
def test_what_is_not_served_is_refused_by_name(client: OpenAI, model: str, extra: dict[str, object], param: str) -> None:
    body = {"input": "hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, **body)  # type: ignore[arg-type]
    assert refused.value.body["param"] == param


def test_a_stored_response_is_continued_retrieved_and_deleted(client: OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input="My name is Ada. Say hello.", max_output_tokens=8,
                                    temperature=0, instructions="You are terse.")
    assert first.store is True
    # instructions are not carried over (OpenAI's rule): an agent sends its own again each turn
    second = client.responses.create(model=model, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=8, temperature=0, instructions="You are terse.")
    assert second.previous_response_id == first.id
    # the stored conversation comes after the instructions: its KV was still in the slot, so only the new input runs
    assert second.usage.input_tokens > first.usage.input_tokens - 8
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 8
    assert client.responses.retrieve(first.id).output_text == first.output_text
    (item,) = client.responses.input_items.list(first.id).data
    assert item.type == "message" and item.content[0].text == "My name is Ada. Say hello."
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(model=model, previous_response_id=first.id, input="And now?", max_output_tokens=2)
    assert gone.value.body["param"] == "previous_response_id"
    third = client.responses.create(model=model, previous_response_id=second.id, input="Bye.", max_output_tokens=2)
    assert third.usage.input_tokens > second.usage.input_tokens  # a chain: each turn carries the ones before


def test_store_false_keeps_nothing(client: OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_input_tokens_is_what_a_response_prefills(client: OpenAI, model: str) -> None:
    ask = {"model": model, "input": "Name a colour.", "instructions": "You are terse."}
    counted = client.responses.input_tokens.count(**ask)
    sent = client.responses.create(**ask, max_output_tokens=1)
    assert counted.object == "response.input_tokens" and counted.input_tokens == sent.usage.input_tokens
    later = client.responses.input_tokens.count(**{**ask, "input": "And another?"}, previous_response_id=sent.id)
    assert later.input_tokens > counted.input_tokens  # the stored turn counts too


def test_logprobs_whole_and_streamed(client: OpenAI, model: str) -> None:
    """`include: ["message.output_text.logprobs"]` and `top_logprobs`: each output token's entry,
    whole and on each delta; the tokens' texts join into the text."""
    asked = {"model": model, "input": "Count: one, two, three,", "max_output_tokens": 6, "temperature": 0,
             "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    whole = client.responses.create(**asked)
    part = whole.output[0].content[0]
    assert len(part.logprobs) == whole.usage.output_tokens == 6 and "".join(e.token for e in part.logprobs) == part.text
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 and e.bytes == list(e.token.encode()) for e in part.logprobs)
    entries, done = [], None
    with client.responses.stream(**asked) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                assert "".join(e.token for e in event.logprobs) == event.delta
                entries += event.logprobs
            elif event.type == "response.incomplete":
                done = event.response
    assert done is not None and [e.token for e in entries] == [e.token for e in done.output[0].content[0].logprobs]
    assert len(entries) == 6
    plain = client.responses.create(model=model, input="Hi", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []  # not asked: none

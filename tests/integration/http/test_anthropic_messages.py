"""Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`) through the official
`anthropic` SDK against the real server and model: whole and streamed replies, tool use and
a tool_result turn, stop sequences, token counts, errors in Anthropic's shape, and the
`x-api-key` header."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import pytest

from tests.integration.http.conftest import API_KEY

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=120)


def test_a_whole_reply(claude: anthropic.Anthropic, model: str) -> None:
    message = claude.messages.create(model=model, max_tokens=8, system="You are terse.",
                                     messages=[{"role": "user", "content": "Name a colour."}])
    assert message.type == "message" and message.role == "assistant" and message.model == model
    assert message.stop_reason in ("end_turn", "max_tokens") and len(message.content) == 1
    assert message.content[0].type == "text" and message.content[0].text
    assert 1 <= message.usage.output_tokens <= 8 and message.usage.input_tokens > 10


def test_the_stream_adds_up_to_the_same_message(claude: anthropic.Anthropic, model: str) -> None:
    kinds: list[str] = []
    with claude.messages.stream(model=model, max_tokens=12, extra_body={"temperature": 0},
                                messages=[{"role": "user", "content": "Count: one, two, three,"}]) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    text = final.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12 and text
    whole = claude.messages.create(model=model, max_tokens=12, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": "Count: one, two, three,"}])
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == \
        final.usage.input_tokens + final.usage.cache_read_input_tokens  # the same prompt, counted alike


def test_a_stop_sequence_is_named(claude: anthropic.Anthropic, model: str) -> None:
    message = claude.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, stop_sequences=["five"],
                                     messages=[{"role": "user", "content": "Count from one to ten in words."}])
    if message.stop_reason == "stop_sequence":  # the tiny model may not count that far
        assert message.stop_sequence == "five" and "five" not in message.content[0].text
    else:
        assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None


def test_tool_use_then_a_tool_result_turn(claude: anthropic.Anthropic, model: str) -> None:
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    message = claude.messages.create(model=model, max_tokens=64, extra_body={"temperature": 0}, tools=[WEATHER],
                                     tool_choice={"type": "tool", "name": "get_weather"}, messages=[ask])
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input.get("city"), str)
    reply = claude.messages.create(model=model, max_tokens=16, extra_body={"temperature": 0}, tools=[WEATHER], messages=[
        ask, {"role": "assistant", "content": message.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]}])
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.content


def test_streamed_tool_use_sends_input_json_deltas(claude: anthropic.Anthropic, model: str) -> None:
    with claude.messages.stream(model=model, max_tokens=64, extra_body={"temperature": 0}, tools=[WEATHER],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather in Rome?"}]) as stream:
        deltas = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                  and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    (call,) = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and json.loads("".join(deltas)) == call.input


def test_count_tokens_is_what_a_turn_prefills(claude: anthropic.Anthropic, model: str) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    counted = claude.messages.count_tokens(model=model, system="You are terse.", messages=messages)
    sent = claude.messages.create(model=model, max_tokens=1, system="You are terse.", messages=messages)
    assert counted.input_tokens == sent.usage.input_tokens + sent.usage.cache_read_input_tokens
    with_tools = claude.messages.count_tokens(model=model, messages=messages, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens  # the tools' preamble
    # what Anthropic's count_tokens takes beside them is accepted and changes no count here
    same = claude.messages.count_tokens(model=model, system="You are terse.", messages=messages,
                                        thinking={"type": "enabled", "budget_tokens": 2048},
                                        output_config={"effort": "low"}, extra_body={"cache_control": {"type": "ephemeral"}})
    assert same.input_tokens == counted.input_tokens


def test_errors_have_anthropics_shape(claude: anthropic.Anthropic, model: str, base_url: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].type" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError) as denied:
        anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "authentication_error"
    request = urllib.request.Request(f"{base_url}/v1/messages", data=json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"x-api-key": API_KEY, "content-type": "application/json", "anthropic-version": "2023-06-01"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=30)
    assert missing.value.code == 400 and "max_tokens is required" in json.loads(missing.value.read())["error"]["message"]

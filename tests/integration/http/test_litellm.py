"""LiteLLM (issue 42 §4) through its own `completion` against the real server and model, as an
OpenAI-compatible provider (`openai/<model>` with `api_base`): text whole and streamed, a
required tool call that parses to the tool's arguments, and the tool's result on the next
turn. LiteLLM reads its price table from the package, never the network."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before the import: no fetch of the price table
import litellm  # noqa: E402

from tests.integration.http.conftest import API_KEY  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _ask(base_url: str, model: str, **kwargs: object):  # type: ignore[no-untyped-def]
    return litellm.completion(model=f"openai/{model}", api_base=f"{base_url}/v1", api_key=API_KEY, temperature=0,
                              timeout=120, num_retries=0, **kwargs)


def test_litellm_text_whole_and_streamed(base_url: str, model: str) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = _ask(base_url, model, messages=messages, max_tokens=8)
    assert whole.choices[0].message.content and 1 <= whole.usage.completion_tokens <= 8
    pieces = [chunk.choices[0].delta.content or "" for chunk in _ask(base_url, model, messages=messages, max_tokens=8,
                                                                     stream=True)]
    assert len(pieces) > 1 and "".join(pieces).strip()


def test_litellm_tool_call_and_its_result(base_url: str, model: str) -> None:
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    reply = _ask(base_url, model, messages=[ask], tools=[WEATHER], tool_choice="required", max_tokens=64)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    said = reply.choices[0].message.model_dump(exclude_none=True)
    answer = _ask(base_url, model, messages=[ask, said, {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}],
                  tools=[WEATHER], max_tokens=64)
    # the history LiteLLM sends (the call, its result) is taken; the reply is text or calls, whole or cut
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.tool_calls if choice.finish_reason == "tool_calls" else isinstance(choice.message.content, str)

"""Tool calls in a model family's own syntax, against the real server and model: the server
is started with Qwen 2.5's chat template (llama.cpp's copy, tests/data/templates), whose
tools are `<tool_call>` JSON blocks, so `--tool-format auto` picks hermes. The template
renders the tools, the calls and the results; a reply that must call is held to the
hermes frames and read back into OpenAI's and Anthropic's shapes, whole and streamed, and
over gRPC. (The default model was not trained on the format; the grammar makes it write it.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import grpc
import jsonschema
import openai
import pytest
from llmserve.client import pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from openai import OpenAI

from harness.server import RunningServer, free_port, start_server, stop_server

TEMPLATE = Path(__file__).parents[2] / "data" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
KEY = "native-tools-key"
MODEL = "gemma-3-270m-q4_k_m"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
              "required": ["city"], "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                      "parameters": PARAMETERS}}]
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["-np", "2", "-c", "4096", "-t", "2", "--chat-template-file", str(TEMPLATE), "--api-key", KEY]
    running = start_server(args, tmp_path_factory.mktemp("native") / "server.log", http_port=free_port())
    yield running
    assert stop_server(running) == 0
    log = running.log_path.read_text()
    assert '"name": "hermes"' in log or "name=hermes" in log, "auto did not pick hermes for the Qwen template"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key=KEY, max_retries=0, timeout=120)


def _checked(calls: list[Any]) -> None:
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert len(calls[0].id) > 8
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMETERS)


def test_a_required_call_is_read_from_the_hermes_block(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message  # the <tool_call> block is not answer text
    _checked(choice.message.tool_calls)
    # the prompt is the template's own tool listing: it holds the tool's description
    assert reply.usage.prompt_tokens > 100


def test_streamed_deltas_add_up_to_the_call(client: OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                            temperature=0, max_tokens=80, stream=True)
    text, heads, arguments, finish = "", [], "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or ():
            if call.id:
                heads.append((call.id, call.function.name))
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and text.strip() == "" and [name for _, name in heads] == ["get_weather"]
    jsonschema.validate(json.loads(arguments), PARAMETERS)
    assert "<tool_call>" not in text


def test_the_result_goes_back_through_the_template(client: OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80).choices[0].message
    call = first.tool_calls[0]
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "Snow, -3 C"}]
    follow = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=16)
    assert follow.choices[0].finish_reason in ("stop", "length") and follow.choices[0].message.content
    # the template wrote the call and the result: the follow-up prompt is longer than the question's by both
    alone = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=1)
    assert follow.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_auto_is_answered_or_called_and_never_shows_a_block(client: OpenAI) -> None:
    choice = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, temperature=0,
                                            max_tokens=60).choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert all(c.function.name == "get_weather" for c in choice.message.tool_calls)
    assert "<tool_call>" not in (choice.message.content or "") or choice.finish_reason == "length"


def test_a_response_format_beside_auto_tools_is_refused_naming_it(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, max_tokens=8,
                                       response_format={"type": "json_object"})
    assert "hermes" in str(refused.value) and refused.value.body["param"] == "response_format"


def test_anthropic_any_gives_a_tool_use_block(server: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.http_port}", api_key=KEY, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=80, messages=QUESTION, extra_body={"temperature": 0},
                                     tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                     tools=[{"name": "get_weather", "description": "Weather in a city",
                                             "input_schema": PARAMETERS}])
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, PARAMETERS)


def test_grpc_required_call_streams_and_ends_with_the_call(server: RunningServer) -> None:
    tool = pb.Tool(name="get_weather", description="Weather in a city", parameters=json.dumps(PARAMETERS))
    config = pb.SessionConfig(sampling=pb.SamplingParams(temperature=0.0), stopping=pb.StoppingCriteria(max_tokens=80),
                              tools=[tool], tool_choice=pb.ToolChoice(mode=pb.ToolChoice.Mode.MODE_REQUIRED))
    request = pb.GenerateRequest(config=config, input=pb.Input(messages=pb.ChatMessages(
        messages=[pb.ChatMessage(role="user", content=QUESTION[0]["content"])])), end_of_turn=True)
    with grpc.insecure_channel(server.address) as channel:
        responses = list(pb_grpc.LLMServiceStub(channel).Generate(
            iter([request]), metadata=[("authorization", f"Bearer {KEY}")], timeout=120))
    streamed = "".join(d.arguments for r in responses if r.HasField("chunk") for d in r.chunk.tool_calls)
    end = responses[-1].turn_end
    assert end.finish_reason == pb.FinishReason.FINISH_REASON_TOOL_CALLS, end
    assert [c.name for c in end.tool_calls] == ["get_weather"] and end.tool_calls[0].arguments == streamed
    jsonschema.validate(json.loads(streamed), PARAMETERS)

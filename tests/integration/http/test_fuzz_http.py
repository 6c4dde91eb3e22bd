"""Hypothesis over every POST route's fields: JSON of any shape and type, strings of any code
point (lone surrogates included), against the real server. Whatever the body, the answer
is never a 5xx; a refusal is OpenAI's error object, and a field at fault is named in
`param` (Anthropic's object on the Messages routes, which has no `param`). After the run the server is alive and serves a plain request.
The server serves a further model (`-m gemma-q8=PATH`): a body's `model` names it, the default,
nothing served, or anything else, so every route's routing by model is fuzzed too.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmserve.service.model.default_model import default_model_path

from harness.models import OTHER_MODEL, two_model_flags
from harness.server import CHAT_SERVER_ARGS, RunningServer, free_port, start_server, stop_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"  # Anthropic's: its error object, which names no param
COUNT = "/v1/messages/count_tokens"
ROUTES = [CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, COUNT]
BASE = {
    CHAT: {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    COMPLETIONS: {"prompt": "Hi", "max_tokens": 1},
    EMBEDDINGS: {"input": "Hi"},
    RESPONSES: {"input": "Hi", "max_output_tokens": 1},
    MESSAGES: {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    COUNT: {"messages": [{"role": "user", "content": "Hi"}]},
}
SAMPLING = ["temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
            "frequency_penalty", "seed", "logit_bias", "stop", "min_tokens", "ignore_eos", "n", "max_tokens"]
FIELDS = {
    CHAT: ["model", "messages", "stream", "stream_options", "max_completion_tokens", "logprobs", "top_logprobs",
           "user", "response_format", "grammar", "regex", "choice", "tools", "tool_choice", "parallel_tool_calls",
           "lora", "deterministic", "no_such_field", *SAMPLING],
    COMPLETIONS: ["model", "prompt", "stream", "stream_options", "logprobs", "echo", "user", "lora", "deterministic",
                  "no_such_field", *SAMPLING],
    EMBEDDINGS: ["model", "input", "encoding_format", "dimensions", "user", "no_such_field"],
    RESPONSES: ["model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                "max_output_tokens", "temperature", "top_p", "stream", "include", "metadata", "reasoning", "store",
                "truncation", "previous_response_id", "background", "top_logprobs", "no_such_field"],
    MESSAGES: ["model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
               "metadata", "tools", "tool_choice", "cache_control", "thinking", "no_such_field"],
    COUNT: ["model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "context_management",
            "cache_control", "no_such_field"],
}
# Any code point: hypothesis leaves lone surrogates out of characters() unless asked for them by range
CODE_POINT = st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXT = st.lists(CODE_POINT, max_size=12).map("".join)  # text() of a union leaves them out too
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
MODEL = st.sampled_from([OTHER_MODEL, default_model_path().stem, "no-such-model", ""]) | JSON
# Shapes a route takes, with one part fuzzed: where most checks live
NEAR = {
    CHAT: st.builds(lambda role, content: {"messages": [{"role": role, "content": content}]},
                    st.sampled_from(["user", "system", "assistant", "tool", "developer"]) | TEXT, JSON),
    COMPLETIONS: st.builds(lambda prompt: {"prompt": prompt}, JSON),
    EMBEDDINGS: st.builds(lambda item: {"input": [item]}, JSON),
    RESPONSES: st.builds(lambda kind, fields: {"input": [{"type": kind, **fields}]},
                         st.sampled_from(["message", "function_call", "function_call_output", "reasoning"]) | TEXT,
                         st.dictionaries(st.sampled_from(["role", "content", "call_id", "name", "arguments", "output"]),
                                         JSON, max_size=4)),
    MESSAGES: st.builds(lambda role, kind, fields: {"messages": [{"role": role, "content": [{"type": kind, **fields}]}]},
                        st.sampled_from(["user", "assistant"]) | TEXT,
                        st.sampled_from(["text", "tool_use", "tool_result", "image"]) | TEXT,
                        st.dictionaries(st.sampled_from(["text", "id", "name", "input", "tool_use_id", "content",
                                                         "is_error"]), JSON, max_size=4)),
}
NEAR[COUNT] = NEAR[MESSAGES]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server([*CHAT_SERVER_ARGS, *two_model_flags(), "--embeddings"], tmp_path_factory.mktemp("fuzz") / "server.log",
                           http_port=free_port())
    yield running
    assert stop_server(running) == 0


def post(server: RunningServer, path: str, body: object) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
    try:  # x-request-timeout: a fuzzed max_tokens or n that is valid ends in seconds (408)
        conn.request("POST", path, json.dumps(body).encode(),
                     {"Content-Type": "application/json", "x-request-timeout": "3"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def check_answer(path: str, body: object, status: int, raw: bytes) -> None:
    assert status < 500, (path, body, raw[:500])
    if status < 400:
        return
    if path.startswith(MESSAGES):
        answer = json.loads(raw)
        assert answer["type"] == "error" and answer["error"]["type"] and answer["error"]["message"], (path, body, raw)
        return
    error = json.loads(raw)["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if status == 400 and isinstance(body, dict) and body:  # an object with fields: the one at fault is named
        assert isinstance(error["param"], str), (path, body, error)  # "" for a field named ""


def fuzz_settings(num_examples: int) -> settings:
    return settings(max_examples=num_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("path", ROUTES)
@fuzz_settings(120)
@given(data=st.data())
def test_any_value_of_any_field_is_never_a_5xx(server: RunningServer, path: str, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(FIELDS[path]), min_size=1, max_size=3, unique=True))
    body = {**BASE[path], **{name: data.draw(MODEL if name == "model" else JSON, label=name) for name in names}}
    check_answer(path, body, *post(server, path, body))


@pytest.mark.parametrize("path", ROUTES)
@fuzz_settings(80)
@given(data=st.data())
def test_near_valid_bodies_are_never_a_5xx(server: RunningServer, path: str, data: st.DataObject) -> None:
    body = {**BASE[path], "model": data.draw(MODEL, label="model"), **data.draw(NEAR[path])}
    check_answer(path, body, *post(server, path, body))


@pytest.mark.parametrize("path", ROUTES)
@fuzz_settings(40)
@given(body=JSON)
def test_any_json_body_is_never_a_5xx(server: RunningServer, path: str, body: object) -> None:
    check_answer(path, body, *post(server, path, body))


def test_the_server_serves_after_the_fuzz(server: RunningServer) -> None:
    for model in (default_model_path().stem, OTHER_MODEL):
        status, raw = post(server, CHAT, {**BASE[CHAT], "model": model})
        assert status == 200 and json.loads(raw)["choices"], raw[:300]
    assert server.process.poll() is None

"""The HTTP API's refusals, as the `openai` SDK's typed errors, and /health."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest
from openai import OpenAI

from .conftest import API_KEY, MAX_BODY

PROMPT = [{"role": "user", "content": "Hello"}]


def test_a_field_not_served_is_refused_by_name(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=PROMPT, modalities=["text"])
    assert caught.value.param == "modalities" and caught.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=PROMPT, extra_body={"no_such_field": 1})
    assert caught.value.param == "no_such_field"


def test_a_value_out_of_range_names_its_field(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=PROMPT, temperature=-1)
    assert caught.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": [{"type": "image_url"}]}])  # type: ignore[list-item]
    assert caught.value.param == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=PROMPT, top_logprobs=2)
    assert caught.value.param == "top_logprobs"


def test_a_wrong_key_is_refused(base_url: str, model: str) -> None:
    wrong = OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model=model, messages=PROMPT)
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_an_unknown_model_is_not_found(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


def test_the_request_id_comes_back(client: OpenAI, model: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model=model, messages=PROMPT, max_tokens=1,
                                                           extra_headers={"x-request-id": "my-id-1"})
    assert raw.headers["x-request-id"] == "my-id-1"
    assert raw.parse().id == "chatcmpl-my-id-1"


def test_health_needs_no_key(base_url: str) -> None:
    with urllib.request.urlopen(f"{base_url}/health", timeout=10) as reply:
        assert reply.status == 200 and json.load(reply) == {"status": "ok"}


def test_an_unknown_route_is_an_openai_error(base_url: str) -> None:
    request = urllib.request.Request(f"{base_url}/v1/nothing", headers={"Authorization": f"Bearer {API_KEY}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 404 and set(json.load(caught.value)["error"]) == {"message", "type", "param", "code"}


def test_a_body_too_large_is_413(base_url: str) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (MAX_BODY + 1000)}]}).encode()
    request = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413 and json.load(caught.value)["error"]["type"] == "invalid_request_error"

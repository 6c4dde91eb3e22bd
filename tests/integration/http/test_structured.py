"""Structured output on /v1/chat/completions through the `openai` SDK, against the real model:
response_format (json_schema strict, json_object) and the extensions regex, choice and grammar.
Whatever the model writes, a reply that finished holds to its constraint."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

PERSON = {
    "type": "object",
    # no minimum/maximum: llama-cpp-python's converter drops them (strict refuses them: test_schema_strict.py)
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"},
                   "pet": {"enum": ["cat", "dog", "none"]}},
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


def _ask(client: OpenAI, model: str, content: str, **kwargs: object) -> tuple[str, str]:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],  # type: ignore[call-overload]
                                           temperature=0, **kwargs)
    return reply.choices[0].message.content, reply.choices[0].finish_reason


def test_json_schema_strict_output_validates(client: OpenAI, model: str) -> None:
    text, finish = _ask(client, model, "Invent a person: give a name and an age.", max_tokens=200,
                        response_format={"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert finish == "stop", text  # the grammar completed
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_parses(client: OpenAI, model: str) -> None:
    # one example turn: the small model then closes its object instead of adding keys until the limit
    messages: list[Any] = [{"role": "user", "content": "A dog, as JSON."},
                           {"role": "assistant", "content": '{"animal": "dog", "legs": 4}'},
                           {"role": "user", "content": "A cat, as JSON."}]
    reply = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=200,
                                           response_format={"type": "json_object"})
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


def test_regex_and_choice_hold(client: OpenAI, model: str) -> None:
    text, finish = _ask(client, model, "What is your favourite number?", max_tokens=20,
                        extra_body={"regex": "[0-9]{3}-[a-z]{2}"})
    assert finish == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
    options = ["red", "green", "blue"]
    text, finish = _ask(client, model, "Pick a colour.", max_tokens=10, extra_body={"choice": options})
    assert finish == "stop" and text in options, text
    text, finish = _ask(client, model, "Say yes or no.", max_tokens=10, extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert text in ("yes", "no"), text


def test_a_streamed_constraint_holds_too(client: OpenAI, model: str) -> None:
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Pick one."}],
                                                 temperature=0, max_tokens=10, stream=True,
                                                 extra_body={"choice": ["alpha", "beta"]}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in ("alpha", "beta"), text


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a+"}}, "regex"),
    ({"extra_body": {"grammar": "root ::= ", "choice": ["a"]}}, "choice"),
    ({"extra_body": {"grammar": "root ::= nothing-defined"}}, "grammar"),
    ({"extra_body": {"regex": "(?=lookahead)x"}}, "regex"),
    ({"extra_body": {"choice": []}}, "choice"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                      "maxItems": 10**6}}}},
     "response_format.json_schema.schema"),
])
def test_a_bad_constraint_names_its_field(client: OpenAI, model: str, kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,  # type: ignore[call-overload]
                                       **kwargs)
    assert caught.value.param == param, caught.value

"""`response_format: {"type": "json_schema", "json_schema": {"strict": true}}` through the
`openai` SDK, against the real model (issue 24 §5): strict refuses, as a 400 naming the
schema's `param`, a keyword the grammar converter would drop (the message names the keyword
and its JSON pointer); without strict the schema is served as before; a recursive tree
with optional children validates; one that can never end is a 400."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

PARAM = "response_format.json_schema.schema"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TREE = {"$defs": {"Node": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": False}}, "$ref": "#/$defs/Node"}
ENDLESS = {"$defs": {"Node": {"type": "object", "properties": {"children": {
    "type": "array", "items": {"$ref": "#/$defs/Node"}, "minItems": 1}}, "required": ["children"]}},
    "$ref": "#/$defs/Node"}


def _format(schema: dict[str, Any], strict: bool | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "answer", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def _ask(client: OpenAI, model: str, schema: dict[str, Any], strict: bool | None, content: str = "Invent a person.",
         **kwargs: Any) -> tuple[str, str]:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],  # type: ignore[call-overload]
                                           max_tokens=kwargs.pop("max_tokens", 120),
                                           response_format=_format(schema, strict), **kwargs)
    return reply.choices[0].message.content, reply.choices[0].finish_reason


@pytest.mark.parametrize(("schema", "named"), [
    (PERSON, "`minimum` at /properties/age/minimum"),
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
      "required": ["tags"], "additionalProperties": False}, "`uniqueItems` at /properties/tags/uniqueItems"),
    ({"type": ["string", "null"], "maxLength": 5}, "`maxLength` at /maxLength"),
])
def test_strict_refuses_what_the_converter_drops(client: OpenAI, model: str, schema: dict[str, Any],
                                                 named: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, model, schema, strict=True, max_tokens=4)
    assert caught.value.status_code == 400
    assert caught.value.param == PARAM, caught.value
    assert named in caught.value.message, caught.value.message


@pytest.mark.parametrize("strict", [None, False])
def test_without_strict_the_schema_is_served_as_before(client: OpenAI, model: str, strict: bool | None) -> None:
    """Served with `minimum` and `maximum` dropped: what the converter enforces holds. The
    grammar ends within max_tokens (a name of at most 20 characters, an integer of at most
    16 digits, bounded whitespace), so the reply must finish."""
    text, finish = _ask(client, model, PERSON, strict=strict, temperature=0, max_tokens=200)
    assert finish == "stop", text
    enforced = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"}}}
    jsonschema.validate(json.loads(text), enforced)


def test_a_strict_schema_the_converter_enforces_holds(client: OpenAI, model: str) -> None:
    enforced = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"}}}
    text, finish = _ask(client, model, enforced, strict=True, temperature=0)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), enforced)


def test_a_recursive_tree_with_optional_children_validates(client: OpenAI, model: str) -> None:
    finished, patient = 0, client.with_options(timeout=600)  # 0.8 may write a long tree on a busy machine
    for seed in range(3):
        text, finish = _ask(patient, model, TREE, strict=True, temperature=0.8, seed=seed, max_tokens=150,
                            content='Repeat this JSON exactly: {"name": "a", "children": [{"name": "b"}]}')
        assert text.startswith("{"), text
        if finish == "stop":
            jsonschema.validate(json.loads(text), TREE)
            finished += 1
    assert finished


class Node(BaseModel):
    """The SDK's strict schema for it: `children` required, its items `Node` again, and may be empty."""

    name: str
    children: list[Node]


def test_the_sdks_parse_helper_sends_a_strict_recursive_schema_that_is_served(client: OpenAI, model: str) -> None:
    reply = client.with_options(timeout=600).chat.completions.parse(
        model=model, messages=[{"role": "user", "content": 'Repeat exactly: {"name": "a", "children": []}'}],
        response_format=Node, max_tokens=150, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content  # asked to repeat a one-node tree
    assert isinstance(choice.message.parsed, Node), choice.message.content
    jsonschema.validate(json.loads(choice.message.content), Node.model_json_schema())


@pytest.mark.parametrize("strict", [None, True])
def test_a_tree_that_can_never_end_is_refused(client: OpenAI, model: str, strict: bool | None) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, model, ENDLESS, strict=strict, max_tokens=4)
    assert caught.value.param == PARAM, caught.value
    assert "no finite instance" in caught.value.message, caught.value.message

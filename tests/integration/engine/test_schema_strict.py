"""`Constraint.strict` and recursive JSON schemas over gRPC, on the real model (issue 24 §5):
strict refuses, by keyword and JSON pointer, what the grammar converter would drop; a tree
whose children are optional generates JSON that validates; one that can never end is
INVALID_ARGUMENT whether strict or not."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import Client, pb

from tests.helpers import generate_constrained, reply_text

FIELD = "config.constraint.json_schema"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}
TREE = {"$defs": {"Node": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": False}}, "$ref": "#/$defs/Node"}
ENDLESS = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"},
                                                         "minItems": 1}},
           "required": ["children"], "additionalProperties": False}


def _refusal(address: str, constraint: pb.Constraint) -> tuple[str, str]:
    """The refusal's BadRequest field and its message."""
    with pytest.raises(grpc.RpcError) as err:
        generate_constrained(address, constraint, max_tokens=4)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return bad.field_violations[0].field, err.value.details()
    raise AssertionError("no BadRequest in the status")


def test_strict_refuses_a_keyword_the_converter_drops_naming_it(server) -> None:  # type: ignore[no-untyped-def]
    field, message = _refusal(server.address, pb.Constraint(json_schema=json.dumps(PERSON), strict=True))
    assert field == FIELD
    assert "`minimum` at /properties/age/minimum" in message, message
    email = json.dumps({"type": "string", "format": "email"})
    field, message = _refusal(server.address, pb.Constraint(json_schema=email, strict=True))
    assert field == FIELD and "`format` at /format" in message and "email" in message, message


def test_without_strict_the_same_schema_is_served_as_before(server) -> None:  # type: ignore[no-untyped-def]
    responses = generate_constrained(server.address, pb.Constraint(json_schema=json.dumps(PERSON)), max_tokens=60)
    assert responses[-1].HasField("turn_end")


def test_a_strict_schema_the_converter_enforces_holds(server) -> None:  # type: ignore[no-untyped-def]
    enforced = {**PERSON, "properties": {**PERSON["properties"], "age": {"type": "integer"},
                                         "pet": {"enum": ["cat", "dog", None]}}, "required": ["name", "age", "pet"]}
    for seed in range(3):
        responses = generate_constrained(
            server.address, pb.Constraint(json_schema=json.dumps(enforced), strict=True), seed=seed, max_tokens=120
        )
        assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP, reply_text(responses)
        jsonschema.validate(json.loads(reply_text(responses)), enforced)
    with Client(server.address, timeout=30) as client:
        assert client.model_info().features.strict


def test_a_strict_one_of_told_apart_by_a_const_property_holds(server) -> None:  # type: ignore[no-untyped-def]
    """What pydantic writes for a discriminated union: oneOf over $refs with a const tag."""
    pet = {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "$defs": {
        "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"], "additionalProperties": False},
        "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "name": {"type": "string", "maxLength": 10}},
                "required": ["kind", "name"], "additionalProperties": False}}}
    for seed in range(3):
        responses = generate_constrained(
            server.address, pb.Constraint(json_schema=json.dumps(pet), strict=True), seed=seed, max_tokens=80,
            prompt="A pet as JSON:"
        )
        assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP, reply_text(responses)
        jsonschema.validate(json.loads(reply_text(responses)), pet)


@pytest.mark.parametrize("strict", [False, True])
def test_a_recursive_tree_with_optional_children_generates_valid_json(server, strict: bool) -> None:  # type: ignore[no-untyped-def]
    """Sampled at 0.8: a tree may run past max_tokens (then it is a tree's beginning); each
    one that finished validates, and some finish."""
    finished = 0
    for seed in range(6):
        responses = generate_constrained(
            server.address, pb.Constraint(json_schema=json.dumps(TREE), strict=strict), seed=seed, max_tokens=200,
            prompt='Repeat this JSON exactly: {"name": "a", "children": [{"name": "b"}]}\nJSON:',
        )
        text = reply_text(responses)
        assert text.startswith("{"), text
        if responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP:
            jsonschema.validate(json.loads(text), TREE)
            finished += 1
    assert finished


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("schema", [
    {"$defs": {"Node": ENDLESS}, "$ref": "#/$defs/Node"},
    {"type": "object", "properties": {"tree": {"$ref": "#/$defs/Node"}}, "required": ["tree"],
     "$defs": {"Node": ENDLESS}},
])
def test_a_tree_that_can_never_end_is_invalid_argument(server, schema: dict[str, object], strict: bool) -> None:  # type: ignore[no-untyped-def]
    field, message = _refusal(server.address, pb.Constraint(json_schema=json.dumps(schema), strict=strict))
    assert field == FIELD and "no finite instance" in message, message

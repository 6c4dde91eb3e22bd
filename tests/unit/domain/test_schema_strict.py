"""`strict` JSON schemas (domain/schema_strict.py): each keyword the grammar converter drops
is refused by name and JSON pointer, and the converter itself shows that it drops it (the
schema without the keyword becomes the same grammar); what it enforces passes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmserve.service.domain.errors import InvalidRequest
from llmserve.service.domain.schema_pattern import unsafe_piece
from llmserve.service.domain.schema_strict import check_strict
from llmserve.service.model.grammar_sources import to_gbnf

INT, STR = {"type": "integer"}, {"type": "string"}
OBJ_A = {"type": "object", "properties": {"a": INT}, "required": ["a"], "additionalProperties": False}

# (schema, the refused keyword's pointer): the converter writes the same grammar without it.
DROPPED: list[tuple[dict[str, Any], str]] = [
    ({"type": "integer", "minimum": 1}, "/minimum"),
    ({"type": "integer", "maximum": 9}, "/maximum"),
    ({"type": "number", "exclusiveMinimum": 0}, "/exclusiveMinimum"),
    ({"type": "number", "multipleOf": 0.5}, "/multipleOf"),
    ({"type": "string", "format": "email"}, "/format"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "uri"}}}, "/properties/when/format"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "/maxLength"),
    ({"type": "string", "format": "date", "minLength": 12}, "/minLength"),
    ({"type": ["string", "null"], "maxLength": 3}, "/maxLength"),
    ({"type": ["string", "null"], "enum": ["a", None]}, "/enum"),
    ({"type": "array", "items": INT, "uniqueItems": True}, "/uniqueItems"),
    ({"type": "array", "items": INT, "contains": {"const": 1}}, "/contains"),
    ({"type": "array", "minItems": 2}, "/minItems"),
    ({"type": "array", "items": INT, "prefixItems": [STR]}, "/prefixItems"),
    ({"type": "array", "prefixItems": [INT], "minItems": 2}, "/minItems"),
    ({**OBJ_A, "patternProperties": {"^x": INT}}, "/patternProperties"),
    ({**OBJ_A, "minProperties": 2}, "/minProperties"),
    ({**OBJ_A, "maxProperties": 0}, "/maxProperties"),
    ({**OBJ_A, "propertyNames": {"maxLength": 1}}, "/propertyNames"),
    ({**OBJ_A, "dependentRequired": {"a": ["b"]}}, "/dependentRequired"),
    ({**OBJ_A, "not": {"required": ["a"]}}, "/not"),
    ({**OBJ_A, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "/if"),
    ({**OBJ_A, "allOf": [{"properties": {"b": STR}}]}, "/allOf"),
    ({**OBJ_A, "unevaluatedProperties": False}, "/unevaluatedProperties"),
    ({"type": "object", "required": ["a"]}, "/required"),
    ({"$ref": "#/$defs/s", "maxLength": 2, "$defs": {"s": STR}}, "/maxLength"),
    ({"anyOf": [STR, INT], "minimum": 3}, "/minimum"),
    ({"anyOf": [STR, INT], "type": "string"}, "/type"),
    ({"const": "abc", "maxLength": 2}, "/maxLength"),
    ({"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}, "$defs": {"N": {"type": "integer", "maximum": 3}}},
     "/$defs/N/maximum"),
    ({"type": "object", "properties": {"x/y": {"type": "number", "minimum": 0}}}, "/properties/x~1y/minimum"),
]


def _without(schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    copied = copy.deepcopy(schema)
    *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]
    node = copied
    for token in parents:
        node = node[token]
    del node[last]
    return copied


def _refused(schema: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        check_strict(schema, "config.constraint.json_schema")
    assert refused.value.field == "config.constraint.json_schema"
    return refused.value


@pytest.mark.parametrize(("schema", "pointer"), DROPPED)
def test_a_dropped_keyword_is_refused_by_name_and_pointer(schema: dict[str, Any], pointer: str) -> None:
    keyword = pointer.rsplit("/", 1)[1]
    message = str(_refused(schema))
    assert f"`{keyword}` at {pointer}" in message, message
    # the proof that it is dropped: the converter writes the same grammar without it
    assert to_gbnf("json_schema", json.dumps(_without(schema, pointer))) == to_gbnf("json_schema", json.dumps(schema))


# (schema, pointer): not dropped outright, but the grammar would let through what the schema refuses.
LOOSENED: list[tuple[dict[str, Any], str]] = [
    ({"oneOf": [STR, {"type": "string", "maxLength": 2}]}, "/oneOf"),  # read as anyOf: both may match
    ({**OBJ_A, "additionalProperties": True}, "/additionalProperties"),  # an extra key may be "a" again
    ({**OBJ_A, "additionalProperties": STR}, "/additionalProperties"),
    ({**OBJ_A, "required": ["a", "b"]}, "/required"),  # b is never written
    ({"allOf": [{"anyOf": [OBJ_A]}]}, "/allOf/0/anyOf"),  # its properties become optional
    ({"allOf": [OBJ_A, OBJ_A]}, "/allOf/1/properties"),  # "a" written twice
    ({"allOf": [OBJ_A, {"properties": {"b": STR}}]}, "/allOf/0/additionalProperties"),
    ({"enum": ["a", 1], "type": "string"}, "/type"),  # 1 would be written
    ({"anyOf": []}, "/anyOf"),  # nothing would be written
    ({"type": "string", "minLength": 3, "maxLength": 2}, "/maxLength"),
    ({"type": "object", "properties": {"p": {"not": STR}}}, "/properties/p/not"),
    ({"type": "string", "pattern": "^.+$"}, "/pattern"),  # "." can be a raw quote in the JSON string
    ({"type": "string", "pattern": "^[^@]+@[a-z]+$"}, "/pattern"),
    ({"type": "string", "pattern": '^say "hi"$'}, "/pattern"),
]


@pytest.mark.parametrize(("schema", "pointer"), LOOSENED)
def test_a_keyword_the_grammar_would_loosen_is_refused(schema: dict[str, Any], pointer: str) -> None:
    message = str(_refused(schema))
    assert f"`{pointer.rsplit('/', 1)[1]}` at {pointer}" in message, message


TREE = {"$defs": {"Node": {"type": "object", "properties": {"name": STR, "children": {
    "type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 3}}, "required": ["name"],
    "additionalProperties": False}}, "$ref": "#/$defs/Node"}
PETS = {  # what pydantic writes for a discriminated union
    "$defs": {
        "Cat": {"properties": {"kind": {"const": "cat", "type": "string"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"], "title": "Cat", "type": "object", "additionalProperties": False},
        "Dog": {"properties": {"kind": {"const": "dog", "type": "string"}, "name": STR},
                "required": ["kind", "name"], "title": "Dog", "type": "object", "additionalProperties": False},
    },
    "properties": {"pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                           "discriminator": {"propertyName": "kind"}, "title": "Pet"}},
    "required": ["pet"], "title": "Owner", "type": "object", "additionalProperties": False,
}
ENFORCED = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": INT,
                                      "pet": {"enum": ["cat", "dog", "none"]}},
     "required": ["name", "age", "pet"], "additionalProperties": False},
    TREE,
    PETS,
    {"oneOf": [STR, INT, {"type": "null"}]},
    {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"}]},
    {"type": "array", "prefixItems": [INT, STR], "items": False, "minItems": 2},
    {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 1, "maxItems": 4},
    {"allOf": [{"$ref": "#/$defs/A"}, {"properties": {"b": STR}, "required": ["b"]}],
     "$defs": {"A": {"type": "object", "properties": {"a": STR}, "required": ["a"]}}},
    {"type": "object", "additionalProperties": INT},
    {"type": "string", "title": "t", "description": "d", "examples": ["x"], "default": "x", "$comment": "c"},
    {"type": "object", "properties": {"a": STR}, "additionalProperties": False, "minLength": 3, "x-extension": 1},
    {"type": "integer", "format": "int32", "uniqueItems": False, "minLength": 0},
    {"const": 5, "type": "number", "maxLength": 2},
    {"type": "string", "enum": ["a", "b"], "const": "a"},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    {"type": "string", "pattern": "^[a-z0-9._%+-]+@[a-z]+(com|org)$"},
]


@pytest.mark.parametrize("schema", ENFORCED)
def test_a_schema_the_converter_enforces_passes_and_converts(schema: dict[str, Any]) -> None:
    check_strict(schema, "response_format.json_schema.schema")
    assert to_gbnf("json_schema", json.dumps(schema)).count("::=") >= 1


def test_each_ref_target_is_walked_once_so_recursion_ends() -> None:
    cyclic = {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]},
                        "B": {"type": "array", "items": {"$ref": "#/$defs/A"}, "maxItems": 2}}, "$ref": "#/$defs/A"}
    check_strict(cyclic, "f")
    broken = copy.deepcopy(cyclic)
    broken["$defs"]["B"]["uniqueItems"] = True
    assert "`uniqueItems` at /$defs/B/uniqueItems" in str(_refused(broken))


def test_a_long_chain_of_refs_does_not_recurse() -> None:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    defs["d5000"] = {"type": "integer", "minimum": 0}
    assert "/$defs/d5000/minimum" in str(_refused({"$defs": defs, "$ref": "#/$defs/d0"}))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=3)
                    | st.sampled_from(["object", "array", "string", "integer", "#", "#/a", "#/$defs/x", "uuid"]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["type", "properties", "required", "items", "prefixItems", "anyOf", "oneOf",
                                         "allOf", "enum", "const", "$ref", "$defs", "a", "x", "format", "minItems",
                                         "maxItems", "minLength", "additionalProperties", "pattern", "not"]),
                        inner, max_size=4), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_any_json_is_checked_without_crashing(schema: object) -> None:
    try:
        check_strict(schema, "f")
    except InvalidRequest as refused:
        assert refused.field == "f" and "` at /" in str(refused)


def test_a_pattern_that_could_write_what_json_escapes_is_found() -> None:
    """The converter copies a pattern into the string's raw text: its `.` admits a raw quote."""
    assert "dot ::= [^\\x0A\\x0D]" in to_gbnf("json_schema", json.dumps({"type": "string", "pattern": "^.$"}))
    found = {"^a.b$": ".", "^[^x]$": "[^x]", "^[ -~]+$": "[ -~]", '^\\"$': '\\"', "^\\\\$": "\\\\",
             "^\\x22$": "\\x22", "^[\\x00-\\x1f]$": "[\\x00-\\x1f]", "^\\n$": "\\n", "^a\tb$": "\t"}
    for pattern, piece in found.items():
        assert unsafe_piece(pattern) == piece, pattern
    for pattern in ("^[a-z]+$", "^[!\\-~]$", "^(ab|cd){2}$", "^\\x41$", "^[\\x20-\\x21]$", "^\\d$", "[", "\\"):
        assert unsafe_piece(pattern) is None, pattern

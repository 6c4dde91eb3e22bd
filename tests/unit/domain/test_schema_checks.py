"""The one rule every constraint is held to (domain/schema_checks.py), whichever field
sends it: a response_format schema, a gRPC Constraint, a regex, a tool's parameters."""

from __future__ import annotations

import json

import pytest
from llmserve.service.domain.errors import InvalidRequest
from llmserve.service.domain.schema_checks import check_constraint, check_schema
from llmserve.service.domain.schema_pattern import empty_repeat


@pytest.mark.parametrize(("schema", "said"), [
    ({"type": "integer", "minimum": 5, "maximum": 4}, "[5, 4] hold no integer"),
    ({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5}, "(4, 5) hold no integer"),
    ({"type": "number", "minimum": 4, "exclusiveMaximum": 4}, "hold no number"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems 3 is above maxItems 2"),
    ({"type": "object", "minProperties": 3, "maxProperties": 2}, "minProperties 3"),
    ({"anyOf": [{"type": "string"}, {"enum": []}]}, "at /anyOf/1: its enum is empty"),
    ({"oneOf": [{"const": i} for i in range(257)]}, "oneOf at / lists 257"),
    ({"type": "string", "pattern": "^(a|b?)+$"}, "can match nothing"),
])
def test_what_no_value_satisfies_or_could_stall_the_executor_is_refused(schema: dict[str, object], said: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_schema(json.dumps(schema), "response_format.json_schema.schema")
    assert refused.value.field == "response_format.json_schema.schema" and said in str(refused.value), refused.value


@pytest.mark.parametrize("schema", [
    {"type": "number", "minimum": 4, "maximum": 4},
    {"type": "number", "exclusiveMinimum": 4, "exclusiveMaximum": 4.5},
    {"type": ["integer", "null"], "minimum": 5, "maximum": 4},
    {"minItems": 3, "maxItems": 2},  # no type: a string satisfies it
    {"const": {"type": "integer", "minimum": 5, "maximum": 4}},  # a value, not a schema
    {"enum": list(range(256))},
    {"type": "string", "pattern": "^([a-z]{1,3}){0,20}(-[0-9]+)*$"},
])
def test_what_some_value_satisfies_is_served(schema: dict[str, object]) -> None:
    check_schema(json.dumps(schema), "f")


def test_a_regex_constraint_keeps_the_pattern_rule() -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_constraint("regex", "([a-z]{0,3}){0,20}", "config.constraint.regex")
    assert refused.value.field == "config.constraint.regex" and "can match nothing" in str(refused.value)
    check_constraint("regex", "[a-z]+(,[a-z]+)*", "regex")


@pytest.mark.parametrize(("pattern", "piece"), [
    ("^([a-z]{0,3}){0,20}$", "([a-z]{0,3}){0,20}"), ("(a*)+", "(a*)+"), ("x(a?){2,}", "(a?){2,}"),
    ("(a|){3}", "(a|){3}"), ("((a?)(b?))*", "((a?)(b?))*"),
    ("(a?){0,1}", None), ("(a?)?", None), ("(ab?)*", None), ("[a-z]*", None), ("(\\d+,)*", None),
])
def test_an_empty_repeat_is_found_where_it_is(pattern: str, piece: str | None) -> None:
    assert empty_repeat(pattern) == piece

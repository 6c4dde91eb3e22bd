"""Recursive JSON schemas through the converter (model/grammar_sources.py): a `$ref` into the
schema's own `$defs` resolves (the shipped converter failed on a root `$ref`), each target
gets its own rule, and a schema part that can never end is refused (model/grammar_ends.py)."""

from __future__ import annotations

import json
import re

import pytest
from llmserve.service.model.grammar_ends import unending_rules
from llmserve.service.model.grammar_sources import to_gbnf

NODE = {"type": "object", "properties": {"name": {"type": "string"},
                                         "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        "required": ["name"], "additionalProperties": False}
ENDLESS = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"},
                                                         "minItems": 1}},
           "required": ["children"], "additionalProperties": False}


def _rule(gbnf: str, name: str) -> str:
    """A rule's body, through rules that only name another rule."""
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines())
    while re.fullmatch(r"[A-Za-z0-9-]+", rules[name]):
        name = rules[name]
    return rules[name]


@pytest.mark.parametrize("schema", [
    {"$defs": {"Node": NODE}, "$ref": "#/$defs/Node"},  # the root is the reference (KeyError before)
    {"type": "object", "properties": {"tree": {"$ref": "#/$defs/Node"}}, "required": ["tree"], "$defs": {"Node": NODE}},
    {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}},  # the root itself
    {"definitions": {"a b": {"type": "array", "items": {"$ref": "#/definitions/a%20b"}}}, "$ref": "#/definitions/a%20b"},
])
def test_a_recursive_schema_with_a_finite_instance_converts(schema: dict[str, object]) -> None:
    gbnf = to_gbnf("json_schema", json.dumps(schema))
    assert "root ::=" in gbnf and unending_rules(gbnf) == []


@pytest.mark.parametrize("schema", [
    {"$defs": {"Node": ENDLESS}, "$ref": "#/$defs/Node"},
    {"type": "object", "properties": {"tree": {"$ref": "#/$defs/Node"}}, "required": ["tree"],
     "$defs": {"Node": ENDLESS}},
    # optional, but the model could start it and never finish it
    {"type": "object", "properties": {"tree": {"$ref": "#/$defs/Node"}}, "$defs": {"Node": ENDLESS}},
    {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},
])
def test_a_schema_part_without_a_finite_instance_is_refused(schema: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="no finite instance"):
        to_gbnf("json_schema", json.dumps(schema))


def test_each_reference_target_gets_its_own_rule() -> None:
    """The shipped converter named a target's rule by its last segment: a def called `string`
    became the builtin string rule once a string property had made it."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"$ref": "#/$defs/string"},
                                               "m": {"$ref": "#/$defs/inner/$defs/string"}},
              "required": ["name", "n", "m"],
              "$defs": {"string": {"type": "integer"}, "inner": {"$defs": {"string": {"type": "boolean"}}}}}
    gbnf = to_gbnf("json_schema", json.dumps(schema))
    assert _rule(gbnf, "n").startswith('("-"? integral-part)'), gbnf
    assert _rule(gbnf, "m") == '("true" | "false") space', gbnf
    assert _rule(gbnf, "name-kv").endswith("string")


@pytest.mark.parametrize("ref", ["https://example.com/s.json", "#/$defs/missing", "#anchor", "other.json#/a"])
def test_a_reference_outside_the_schema_is_refused(ref: str) -> None:
    with pytest.raises(ValueError, match=r"\$ref"):
        to_gbnf("json_schema", json.dumps({"$ref": ref, "$defs": {}}))


def test_the_reading_of_gbnf() -> None:
    assert unending_rules('root ::= a\na ::= "x" a') == ["a", "root"]
    assert unending_rules('root ::= a\na ::= "x" a | "y"') == []
    assert unending_rules('root ::= "(" b* ")"\nb ::= "[" b "]"') == ["b"]  # reachable, never ends
    assert unending_rules('root ::= "x"\nunused ::= unused "y"') == []
    assert unending_rules('root ::= (a){2,3} # comment\na ::= [^"\\\\\\]] a') == ["a", "root"]
    assert unending_rules('root ::= (a){0,3}\na ::= a') == ["a"]
    assert unending_rules("root ::= undefined") == []  # llama.cpp's parser refuses it
    for broken in ("root ::= root (", "root ::= root )", "root ::= * root"):  # in a cycle: read in full
        with pytest.raises(ValueError):
            unending_rules(broken)
    assert unending_rules("root ::= (") == []  # a rule that names none ends; llama.cpp refuses the syntax


def test_a_thousand_nested_groups_need_no_recursion() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}
    assert to_gbnf("json_schema", json.dumps(schema)).count("(") > 1000

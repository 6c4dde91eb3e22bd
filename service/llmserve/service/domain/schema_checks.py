"""The one rule every constraint a request sends is held to, wherever it comes from:
`response_format`, `grammar`, `regex`, `choice` (HTTP), `Constraint` (gRPC), or a tool's
parameters (both surfaces: a tool's reply is a constraint like any other).

In order, all cheap and in-process, so that what could make the grammar worker spend its
budget (or crash it), or the executor stall on every step, is refused before it is sent:
the compiler's bounds (request_rules.check_constraint: size, nesting depth, repetition
counts); then for a schema, at each node, what no value could satisfy (`minimum` above
`maximum` for a number, `minLength` above `maxLength` for a string, ... an empty `enum`),
at most `MAX_ALTERNATIVES` values or options (each is a grammar stack while the text
could still be any of them: an enum of 5,000 strings cost 26 s per step over the
vocabulary), and patterns without an empty repeat (schema_pattern.empty_repeat); the
same for a `regex`; last, with `strict`, what the converter would not enforce
(schema_strict.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import request_rules
from .errors import InvalidRequest
from .schema_pattern import empty_repeat
from .schema_pointer import escape_token
from .schema_strict import check_strict

MAX_ALTERNATIVES = request_rules.MAX_CHOICES  # as many as a `choice` constraint may list
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_ONES = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
                "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_COUNT_PAIRS = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"),
                "object": ("minProperties", "maxProperties")}


def check_constraint(kind: str, text: str, field: str, strict: bool = False) -> None:
    """A constraint of any kind ("grammar", "json_schema", "regex", "choice", "json_object")
    within every bound; `strict` (json_schema only): refuse what the converter drops.
    InvalidRequest naming `field` otherwise."""
    if kind == "json_schema":
        check_schema(text, field, strict)
        return
    request_rules.check_constraint(kind, text, field)
    if kind == "regex":
        _check_pattern(text, field, "the regex")


def check_schema(text: str, field: str, strict: bool = False) -> Any:
    """The schema `text` parsed, after every check above; InvalidRequest naming `field`."""
    request_rules.check_constraint("json_schema", text, field)
    schema = json.loads(text)  # it parses: check_constraint refused it otherwise
    _walk(schema, field)
    if strict:  # refuse what the converter would drop, never loosen the schema
        check_strict(schema, field)
    return schema


def check_object_schema(text: str, field: str, strict: bool = False) -> dict[str, Any]:
    """As `check_schema`, where only a JSON schema object is taken (a tool's parameters)."""
    schema = check_schema(text, field, strict)
    if not isinstance(schema, dict):
        raise InvalidRequest("the JSON schema must be an object", field=field)
    return schema


def _walk(root: Any, field: str) -> None:
    """Every node where a schema is (not into `const`, `enum`, `default` or `examples`,
    which are values); nesting is bounded already (request_rules)."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        _check_node(node, path or "/", field)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((sub, f"{path}/{key}/{escape_token(name)}") for name, sub in node[key].items())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((sub, f"{path}/{key}/{i}") for i, sub in enumerate(node[key]))
        stack.extend((node[key], f"{path}/{key}") for key in _SCHEMA_ONES if isinstance(node.get(key), dict))


def _check_node(node: dict[str, Any], path: str, field: str) -> None:
    for key in ("enum", "anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list) and len(options) > MAX_ALTERNATIVES:
            raise InvalidRequest(f"{key} at {path} lists {len(options)}; a JSON schema's {key} is limited to "
                                 f"{MAX_ALTERNATIVES}", field=field)
    if node.get("enum") == []:
        raise InvalidRequest(f"no value satisfies the schema at {path}: its enum is empty", field=field)
    kind = node.get("type") if isinstance(node.get("type"), str) else None  # a list of types admits more
    if kind in ("number", "integer"):
        _check_range(node, path, field, kind == "integer")
    elif kind in _COUNT_PAIRS:
        low_key, high_key = _COUNT_PAIRS[kind]
        low, high = _number(node.get(low_key)), _number(node.get(high_key))
        if low is not None and high is not None and low > high:
            raise InvalidRequest(f"no value satisfies the schema at {path}: {low_key} {low:g} is above {high_key} "
                                 f"{high:g}", field=field)
    if isinstance(node.get("pattern"), str):
        _check_pattern(node["pattern"], field, f"the pattern at {path}")


def _check_range(node: dict[str, Any], path: str, field: str, integer: bool) -> None:
    """Refuse bounds no number (or integer) lies within."""
    low, low_open = _bound(node, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(node, "maximum", "exclusiveMaximum", min)
    if low is None or high is None:
        return
    if integer:  # the integers within: [ceil(low), floor(high)], less an excluded end
        low_int = math.floor(low) + 1 if low_open or not float(low).is_integer() else int(low)
        high_int = math.ceil(high) - 1 if high_open or not float(high).is_integer() else int(high)
        empty = low_int > high_int
    else:
        empty = low > high or (low == high and (low_open or high_open))
    if empty:
        raise InvalidRequest(f"no value satisfies the schema at {path}: its bounds {'(' if low_open else '['}{low:g}, "
                             f"{high:g}{')' if high_open else ']'} hold no {'integer' if integer else 'number'}",
                             field=field)


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, tighter: Any) -> tuple[float | None, bool]:
    """The tighter of a node's inclusive and exclusive bound on one side, and whether it is open."""
    closed, opened = _number(node.get(inclusive)), _number(node.get(exclusive))
    if opened is None or (closed is not None and tighter(closed, opened) == closed and closed != opened):
        return closed, False
    return opened, True


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _check_pattern(pattern: str, field: str, what: str) -> None:
    piece = empty_repeat(pattern)
    if piece:
        raise InvalidRequest(f"{what} repeats {piece!r}, which can match nothing: every way to split the text among "
                             "its repetitions would be a grammar path of its own (the grammar could cost seconds a "
                             "token); make each repetition match at least one character", field=field)

"""Structured output on `/v1/chat/completions`: `response_format` and the body extensions
`grammar` (GBNF), `regex` and `choice` (llama-server's / vLLM's names) → one constraint,
compiled by the engine (`Engine.compile_async`, as the gRPC surface does).

At most one constraint: a second is a 400 naming it. `{"type": "text"}` is none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..domain import request_rules
from ..domain.schema_checks import check_constraint, check_schema
from .errors import bad_request

EXTENSIONS = ("grammar", "regex", "choice")


@dataclass(frozen=True)
class Constraint:
    """A constraint's kind (as `Engine.compile_async` takes it), its text, and the request
    field it came from (named in a 400)."""

    kind: str
    text: str
    param: str


@dataclass(frozen=True)
class Format:
    """What the body asked for: the constraint (beside tools, a tool-calling reply's
    `response` must follow a JSON one: the engine's `session_tools`)."""

    constraint: Constraint | None = None


def parse_format(body: dict[str, Any]) -> Format:
    asked = [name for name in ("response_format", *EXTENSIONS) if name in body]
    if "response_format" in body and _format_type(body["response_format"]) == "text":
        asked.remove("response_format")
    if len(asked) > 1:
        raise bad_request(f"{asked[0]} and {asked[1]} are two constraints; send at most one", asked[1])
    if not asked:
        return Format()
    name = asked[0]
    value = body[name]
    if name == "response_format":
        return _response_format(value)
    if name == "choice":
        if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
            raise bad_request("choice must be an array of strings", "choice")
        constraint = Constraint("choice", request_rules.choice_text(value), "choice")
    else:
        if not isinstance(value, str):
            raise bad_request(f"{name} must be a string", name)
        constraint = Constraint(name, value, name)
    check_constraint(constraint.kind, constraint.text, constraint.param)
    return Format(constraint)


def _format_type(value: object) -> str:
    """The type; keys beside it are refused unless that type takes them (text and
    json_object take none, json_schema only json_schema): none is silently ignored."""
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("response_format.type must be text, json_object or json_schema", "response_format.type")
    kind = str(value["type"])
    extra = sorted(set(value) - {"type", "json_schema"} if kind == "json_schema" else set(value) - {"type"})
    if extra:
        raise bad_request(f"response_format.{extra[0]} is not taken by type {kind} (or by this server)",
                          f"response_format.{extra[0]}")
    return kind


def _response_format(value: dict[str, Any]) -> Format:
    kind = value["type"]
    if kind == "json_object":
        return Format(Constraint("json_object", "", "response_format"))
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise bad_request(f"{where} must be an object with name and schema", where)
    for key in spec:
        if key not in ("name", "schema", "strict", "description"):
            raise bad_request(f"{where}.{key} is not supported by this server", f"{where}.{key}")
    if not isinstance(spec.get("name"), str):
        raise bad_request(f"{where}.name is required (a string)", f"{where}.name")
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise bad_request(f"{where}.strict must be a boolean", f"{where}.strict")
    schema = spec.get("schema", {})  # OpenAI: absent means any JSON object
    if not isinstance(schema, dict):
        raise bad_request(f"{where}.schema must be a JSON schema object", f"{where}.schema")
    constraint = Constraint("json_schema", json.dumps(schema), f"{where}.schema")
    check_schema(constraint.text, constraint.param, strict=spec.get("strict") is True)
    return Format(constraint)

"""Tool calling on `/v1/chat/completions`: the body's fields → the engine's `ToolPlan`,
and the engine's calls → OpenAI's shapes.

`tools`, `tool_choice` and `parallel_tool_calls` → a `ToolPlan` (engine/chat/tools.py). When a
call is possible the session puts the preamble in the system message, holds the reply to
the plan's schema and reads it as it streams into answer text and calls; this module only
translates. `parallel_tool_calls` defaults to false, as llama-server's: a small model
asked for a list repeats calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..domain.errors import InvalidRequest
from ..domain.events import ToolCall, ToolCallDelta
from ..engine.engine import Tool, ToolChoice, ToolFormat, ToolPlan, session_tools
from .errors import bad_request
from .structured import Constraint, Format

FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


def parse_tools(body: dict[str, Any], asked: Format,
                tool_format: ToolFormat) -> tuple[ToolPlan | None, Constraint | None]:
    """The session's tools (None when the body has no tools, and no tool_choice) and the
    constraint it compiles: with a possible call the reply's, else the one asked."""
    if not any(name in body for name in FIELDS):
        return None, asked.constraint
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(_list(body.get("tools", []), "tools")))
    choice = _choice(body.get("tool_choice", "auto" if tools else "none"))
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    constraint = asked.constraint
    try:
        plan, compiled = session_tools(tools, choice, parallel, (constraint.kind, constraint.text) if constraint else None,
                                       constraint.param if constraint else "response_format", tool_format)
    except InvalidRequest as exc:
        raise bad_request(str(exc), _param(exc.field or "tools")) from None
    if plan.active:  # the reply's constraint (None: a native format's reply that may answer)
        constraint = Constraint(*compiled, _param(plan.field)) if compiled is not None else None
    return plan, constraint


def _param(field: str) -> str:
    """The engine's `tools[i].name` is the body's `tools[i].function.name`."""
    return re.sub(r"^(tools\[\d+\])\.", r"\1.function.", field)


def openai_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Calls as OpenAI's `message.tool_calls`."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def openai_deltas(deltas: tuple[ToolCallDelta, ...]) -> list[dict[str, Any]]:
    """Calls as they form, as OpenAI's `delta.tool_calls`: a call's head carries its index,
    id, type and name (arguments ""), later pieces its index and argument fragments."""
    out: list[dict[str, Any]] = []
    for d in deltas:
        if d.id:
            out.append({"index": d.index, "id": d.id, "type": "function",
                        "function": {"name": d.name, "arguments": d.arguments}})
        else:
            out.append({"index": d.index, "function": {"arguments": d.arguments}})
    return out


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise bad_request(f"{where} must be an array", where)
    return value


def _tool(value: object, where: str) -> Tool:
    if not isinstance(value, dict) or value.get("type") != "function":
        raise bad_request(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", f"{where}.type")
    for key in value:
        if key not in ("type", "function"):
            raise bad_request(f"{where}.{key} is not supported by this server", f"{where}.{key}")
    function = value.get("function")
    if not isinstance(function, dict):
        raise bad_request(f"{where}.function must be an object", f"{where}.function")
    for key in function:
        if key not in ("name", "description", "parameters", "strict"):
            raise bad_request(f"{where}.function.{key} is not supported by this server", f"{where}.function.{key}")
    name = function.get("name")
    if not isinstance(name, str):
        raise bad_request(f"{where}.function.name is required (a string)", f"{where}.function.name")
    description = _optional(function, "description", str, "", f"{where}.function", "a string")
    parameters = _optional(function, "parameters", dict, None, f"{where}.function", "a JSON schema object")
    strict = _optional(function, "strict", bool, False, f"{where}.function", "a boolean")
    return Tool(name, description, json.dumps(parameters) if parameters is not None else "", strict)


def _optional(value: dict[str, Any], key: str, kind: type, default: Any, where: str, what: str) -> Any:
    """`value[key]` of type `kind`; `default` when absent or null. A value of another type is
    refused naming it, never replaced (`parameters: false` is not "no parameters")."""
    got = value.get(key)
    if got is None:
        return default
    if not isinstance(got, kind) or (kind is not bool and isinstance(got, bool)):
        raise bad_request(f"{where}.{key} must be {what}", f"{where}.{key}")
    return got


def _choice(value: object) -> ToolChoice:
    if value in ("none", "auto", "required"):
        return ToolChoice(str(value))
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        return ToolChoice("function", value["function"]["name"])
    raise bad_request("tool_choice must be none, auto, required or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}", "tool_choice")

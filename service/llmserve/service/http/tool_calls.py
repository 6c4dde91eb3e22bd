"""Tool calling on `/v1/chat/completions`, in the generic format (engine/tools.py).

`tools`, `tool_choice` and `parallel_tool_calls` → a `ToolPlan`. When a call is possible
(the reply schema is not None) the preamble goes first in the system message and the
whole reply is constrained to the schema; the finished reply is parsed into OpenAI's
`tool_calls` (or its `response` into plain content). `parallel_tool_calls` defaults to
false, as llama-server's: a small model asked for a list repeats calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..domain.errors import InvalidRequest
from ..engine.engine import (
    ChatMessage,
    Reply,
    Tool,
    ToolChoice,
    check_tools,
    preamble,
    reply_schema,
)
from .errors import bad_request
from .structured import Constraint, Format

FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass(frozen=True)
class ToolPlan:
    """The request's tools; `schema` is the reply's JSON schema, None when no call is possible."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    schema: dict[str, Any] | None

    @property
    def active(self) -> bool:
        return self.schema is not None


def parse_tools(body: dict[str, Any], asked: Format) -> ToolPlan | None:
    """None when the body has no tools (and no tool_choice)."""
    if not any(name in body for name in FIELDS):
        return None
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(_list(body.get("tools", []), "tools")))
    choice = _choice(body.get("tool_choice", "auto" if tools else "none"))
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    try:
        check_tools(tools, choice)
    except InvalidRequest as exc:  # its tools[i].name is the body's tools[i].function.name
        raise bad_request(str(exc), re.sub(r"^(tools\[\d+\])\.", r"\1.function.", exc.field or "tools")) from None
    schema = reply_schema(tools, choice, parallel, asked.answer_schema)
    if schema is not None and asked.constraint is not None and asked.constraint.kind not in ("json_schema",
                                                                                            "json_object"):
        field = asked.constraint.param
        raise bad_request(f"{field} cannot hold a reply that may call tools; send tool_choice none, "
                          "or response_format", field)
    return ToolPlan(tools, choice, schema)


def reply_constraint(plan: ToolPlan) -> Constraint:
    return Constraint("json_schema", json.dumps(plan.schema), "tools")


def with_preamble(messages: list[ChatMessage], plan: ToolPlan) -> list[ChatMessage]:
    """The preamble as the system message, after an existing first system message's text."""
    assert plan.schema is not None
    text = preamble(plan.tools, plan.schema)
    if messages and messages[0].role == "system":
        return [ChatMessage("system", messages[0].content + "\n\n" + text), *messages[1:]]
    return [ChatMessage("system", text), *messages]


def openai_calls(reply: Reply) -> list[dict[str, Any]]:
    """The reply's calls as OpenAI's `message.tool_calls`."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls]


def call_deltas(reply: Reply) -> list[dict[str, Any]]:
    """The `delta`s that stream the calls: per call, its index, id, type and name (arguments
    ""), then its arguments."""
    deltas: list[dict[str, Any]] = []
    for k, call in enumerate(reply.tool_calls):
        head = {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]})
    return deltas


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
    name, description = function.get("name"), function.get("description") or ""
    if not isinstance(name, str):
        raise bad_request(f"{where}.function.name is required (a string)", f"{where}.function.name")
    if not isinstance(description, str):
        raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    return Tool(name, description, json.dumps(parameters))


def _choice(value: object) -> ToolChoice:
    if value in ("none", "auto", "required"):
        return ToolChoice(str(value))
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        return ToolChoice("function", value["function"]["name"])
    raise bad_request("tool_choice must be none, auto, required or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}", "tool_choice")

"""Tool calling in the generic format, for chat templates that do not declare tools.

As llama-server's "generic" handler does it: the tools and the reply's JSON schema go
into a system preamble, and the whole reply is constrained (by the same grammar path as
any JSON schema, `Engine.compile_async`) to JSON that is either a tool call or a
response:

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"tool_calls": [{"name": ..., "arguments": {...}}, ...]}     (parallel calls)
    {"response": "It is sunny."}                                 (tool_choice auto)

Tools are constraints like any other: each tool's parameters are held to what every JSON
schema is (domain/schema_checks.py: the compiler's bounds; with the tool's `strict`, what
the converter would not enforce is refused), so a call's arguments always parse, and with
`strict` always validate, against its function's schema (a tool that is not `strict` has
the repetition counts a grammar cannot hold left out: tool_plan.py). engine/chat/tool_reply.py
reads a reply, as it streams, into text and `ToolCall`s with unique ids; `call_frames` is the
native formats' (tool_formats.py) grammar for calls. Both surfaces (gRPC, OpenAI HTTP) use
these through tool_plan.py; nothing here knows either.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...domain.errors import InvalidRequest
from ...domain.events import ToolCall
from ...domain.schema_checks import check_object_schema
from .tool_formats import ToolFormat

MAX_TOOLS = 128
MAX_PARALLEL_CALLS = 8  # calls in one reply: a small model repeats calls until the grammar stops it
MAX_TOOL_SCHEMA_BYTES = 64 * 1024  # one tool's parameters: as much as one response_format schema
MAX_TOOLS_BYTES = 256 * 1024  # all tools' names, descriptions and parameters: the preamble and reply schema
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required", "function")


NO_PARAMETERS = '{"type": "object", "properties": {}}'  # a function whose schema was not given


@dataclass(frozen=True)
class Tool:
    """A function the model may call: `parameters` is its JSON schema, as JSON text ("":
    none given, a function without parameters); `strict`: refuse a keyword of it the
    grammar converter would not enforce."""

    name: str
    description: str = ""
    parameters: str = NO_PARAMETERS
    strict: bool = False

    def __post_init__(self) -> None:
        if not self.parameters:
            object.__setattr__(self, "parameters", NO_PARAMETERS)


@dataclass(frozen=True)
class ToolChoice:
    """none: never call; auto: call or answer; required: call some tool; function: call `name`."""

    mode: str = "auto"
    name: str = ""


@dataclass(frozen=True)
class Reply:
    """A finished reply in the generic format: text (None for a pure tool call) and calls."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


def check_tools(tools: Sequence[Tool], choice: ToolChoice, field: str = "tools") -> None:
    """InvalidRequest, naming the field, unless the tools and the choice can be served:
    names unique and well formed, each tool's parameters a JSON schema object within the
    bounds every schema keeps (and with `strict`, one the converter enforces in full)."""
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools", field=field)
    total = sum(len(t.name) + len(t.description.encode()) + len(t.parameters.encode()) for t in tools)
    if total > MAX_TOOLS_BYTES:  # before any is parsed: the preamble and the reply schema hold them all
        raise InvalidRequest(f"the tools' names, descriptions and parameters are limited to {MAX_TOOLS_BYTES} "
                             f"bytes in all (these have {total})", field=field)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{field}[{i}]"
        if not _TOOL_NAME.match(tool.name):
            raise InvalidRequest("a tool's name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", field=f"{where}.name")
        if tool.name in seen:
            raise InvalidRequest(f"two tools are named {tool.name!r}", field=f"{where}.name")
        seen.add(tool.name)
        if len(tool.parameters.encode()) > MAX_TOOL_SCHEMA_BYTES:
            raise InvalidRequest(f"a tool's parameters are limited to {MAX_TOOL_SCHEMA_BYTES} bytes",
                                 field=f"{where}.parameters")
        check_object_schema(tool.parameters, f"{where}.parameters", tool.strict)
    if choice.mode not in CHOICES:
        raise InvalidRequest(f"tool_choice must be one of {', '.join(CHOICES[:3])} or a function", field="tool_choice")
    if choice.mode == "function" and choice.name not in seen:
        raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not among the tools", field="tool_choice")
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest("tool_choice asks for a call but there are no tools", field="tool_choice")


def _call_schema(tool: Tool, defs: dict[str, Any], arguments_key: str = "arguments") -> dict[str, Any]:
    arguments = _hoisted(json.loads(tool.parameters), f"tool-{tool.name}", defs)
    return {"type": "object", "properties": {"name": {"const": tool.name}, arguments_key: arguments},
            "required": ["name", arguments_key]}


def _hoisted(document: dict[str, Any], key: str, defs: dict[str, Any]) -> dict[str, Any]:
    """A schema document (a tool's parameters, the answer's) inside the reply schema. Its
    local `$ref`s point into itself (pydantic's `#/$defs/Item`, or `#`): the whole document
    moves, its own `$defs` with it, to the reply's `$defs[key]`, and every local ref is
    rebased onto it (`#/$defs/Item` -> `#/$defs/<key>/$defs/Item`). Keys are `tool-<name>`
    (names are unique, and `/` and `~` are not in them) and `response`, so no document's
    ref can reach another's definitions. Without refs it stays inline."""
    if '"$ref"' not in json.dumps(document):
        return document
    defs[key] = _rebased(document, f"#/$defs/{key}")
    return {"$ref": f"#/$defs/{key}"}


def _rebased(node: Any, base: str) -> Any:
    if isinstance(node, list):
        return [_rebased(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: base + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#")
            else _rebased(value, base) for key, value in node.items()}


def reply_schema(tools: Sequence[Tool], choice: ToolChoice, parallel: bool = False,
                 response: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The JSON schema the whole reply is held to; None when no call is possible (no tools,
    or tool_choice none). `response`: the schema of a text answer's `response` (a string
    unless response_format says otherwise)."""
    if not tools or choice.mode == "none":
        return None
    callable_tools = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    defs: dict[str, Any] = {}
    calls = [_call_schema(t, defs) for t in callable_tools]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1,
                                                                     "maxItems": MAX_PARALLEL_CALLS}},
                "required": ["tool_calls"]}
    else:
        call = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
    if choice.mode == "auto":
        answer_schema = _hoisted(response, "response", defs) if response else {"type": "string"}
        answer = {"type": "object", "properties": {"response": answer_schema}, "required": ["response"]}
        call = {"anyOf": [call, answer]}
    return {**call, "$defs": defs} if defs else call


def preamble(tools: Sequence[Tool], schema: dict[str, Any]) -> str:
    """The system text that tells the model about the tools and the reply's format."""
    listed = [{"name": t.name, "description": t.description, "parameters": json.loads(t.parameters)} for t in tools]
    return (
        "You can call these tools:\n" + json.dumps(listed, indent=2) + "\n\n"
        "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
        "(your reply to the user's request), following this schema:\n" + json.dumps(schema, indent=2)
    )


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def call_frames(fmt: ToolFormat, tools: Sequence[Tool], parallel: bool, lazy: bool = False) -> dict[str, Any]:
    """The "tool_frames" constraint's document (model/grammar_sources.py): a reply of 1 (or
    with `parallel`, up to MAX_PARALLEL_CALLS) calls of `tools`, in `fmt`'s syntax. `lazy`:
    the reply may answer first; the frames hold it from `fmt.opening` on (its `trigger`)."""
    max_calls = MAX_PARALLEL_CALLS if parallel and fmt.name != "llama3" else 1  # Llama 3.x: one call a reply
    if lazy:
        frames = call_frames(fmt, tools, parallel)
        if not frames["opening"].startswith(fmt.opening):  # llama3: the call follows the tag
            frames["opening"] = fmt.opening + frames["opening"]
        return {**frames, "trigger": fmt.opening}
    if fmt.args_tag:
        return {"named": [{"name": t.name, "schema": json.loads(t.parameters)} for t in tools],
                "opening": fmt.opening, "max_calls": max_calls}
    defs: dict[str, Any] = {}
    calls = [_call_schema(t, defs, fmt.arguments_key) for t in tools]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if fmt.array:
        one = {"type": "array", "items": one, "minItems": 1, "maxItems": max_calls}
        return {"schema": {**one, "$defs": defs}, "opening": fmt.opening, "closing": "", "max_calls": 1}
    framed = bool(fmt.closing)  # hermes: <tool_call>\n{...}\n</tool_call> per call
    return {"schema": {**one, "$defs": defs}, "opening": fmt.opening + "\n" if framed else "",
            "closing": "\n" + fmt.closing if framed else "", "max_calls": max_calls if framed else 1}

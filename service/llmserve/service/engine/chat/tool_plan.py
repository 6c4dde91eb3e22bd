"""A session's tool plan: the tools checked, in the engine's tool format (tool_formats.py),
and the constraint its replies are held to: the generic format's reply schema (tools.py
`reply_schema`), a native format's call frames (`call_frames`), or none. Both surfaces
(gRPC, OpenAI HTTP) plan tools with `session_tools`; nothing here knows either."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...domain.errors import InvalidRequest
from ...domain.request_rules import without_large_counts
from .chat import ChatMessage
from .tool_formats import GENERIC, ToolFormat
from .tools import MAX_TOOL_SCHEMA_BYTES, Tool, ToolChoice, call_frames, check_tools, preamble, reply_schema


@dataclass(frozen=True)
class ToolPlan:
    """A session's tools, in `format` (tool_formats.py). `schema`: in the generic format the
    reply's JSON schema, None when no call is possible; in a native one the calls' frames
    (`call_frames`) when the reply must call, else None (not held). `field`: what a refusal
    of the compiled reply names (the one callable tool's parameters when nothing else is in
    the reply schema, else the tools). Logprobs beside tools are served, on every surface:
    they are the sampled tokens' (the reply's text), as the chunks' token ids are."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    schema: dict[str, Any] | None
    field: str = "tools"
    format: ToolFormat = GENERIC

    @property
    def active(self) -> bool:
        """A call is possible: the tools are rendered and replies are read for calls."""
        return bool(self.tools) and self.choice.mode != "none"


Constraint = tuple[str, str]  # (kind, text), as `Engine.compile_async` takes it


def plan_tools(tools: Sequence[Tool], choice: ToolChoice, parallel: bool,
               answer_schema: dict[str, Any] | None = None, field: str = "tools",
               tool_format: ToolFormat = GENERIC) -> ToolPlan:
    """The checked tools (InvalidRequest naming the field) and the reply's schema.
    `answer_schema`: what a text answer's `response` must follow (response_format)."""
    tools = [_loosened(t) for t in tools]
    check_tools(tools, choice, field)
    callable_at = [i for i, t in enumerate(tools) if choice.mode != "function" or t.name == choice.name]
    alone = len(callable_at) == 1 and (answer_schema is None or choice.mode != "auto")
    if tool_format.native:
        must_call = choice.mode in ("required", "function")
        held = must_call or (choice.mode == "auto" and tool_format.opening_is_token)
        frames = call_frames(tool_format, [tools[i] for i in callable_at], parallel, lazy=not must_call)
        schema = frames if held else None
    else:
        schema = reply_schema(tools, choice, parallel, answer_schema)
    return ToolPlan(tuple(tools), choice, schema, f"{field}[{callable_at[0]}].parameters" if alone else field,
                    tool_format)


def _loosened(tool: Tool) -> Tool:
    """A tool that is not `strict` without the repetition counts its grammar cannot hold
    (request_rules.without_large_counts); a strict one as it is (refused by the checks)."""
    if tool.strict or len(tool.parameters) > MAX_TOOL_SCHEMA_BYTES:
        return tool
    try:
        parameters = json.loads(tool.parameters)
        loosened = without_large_counts(parameters)
    except (ValueError, RecursionError):
        return tool  # not JSON, or nested past any bound: the checks name what is wrong
    return tool if loosened == parameters else replace(tool, parameters=json.dumps(loosened))


def session_tools(tools: Sequence[Tool], choice: ToolChoice, parallel: bool, constraint: Constraint | None,
                  constraint_field: str, tool_format: ToolFormat = GENERIC) -> tuple[ToolPlan, Constraint | None]:
    """A session's plan (`plan_tools`) and the constraint it compiles: with an active plan
    its reply's (None: a native format's reply that may answer), else `constraint`. Beside
    a possible call, `constraint` (named `constraint_field` in a refusal) must be JSON, what
    a text answer's `response` follows (as OpenAI's response_format beside tools):
    json_schema or json_object, in the generic format only. Another kind cannot hold a
    reply that may call tools."""
    can_call = bool(tools) and choice.mode != "none"
    if can_call and constraint is not None and tool_format.native and choice.mode == "auto":
        raise InvalidRequest(f"a constraint beside tools that may be called is served in the generic tool format, "
                             f"not this model's {tool_format.name} (--tool-format)", field=constraint_field)
    answer_schema = _answer_schema(constraint, constraint_field) if can_call and constraint is not None else None
    plan = plan_tools(tools, choice, parallel, answer_schema, tool_format=tool_format)
    return plan, (reply_constraint(plan) if plan.active else constraint)


def _answer_schema(constraint: Constraint, field: str) -> dict[str, Any]:
    kind, text = constraint
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise InvalidRequest(f"a {kind} constraint cannot hold a reply that may call tools: use a JSON schema "
                             "(or JSON object) constraint, or tool choice none", field=field)
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"the schema is not JSON: {exc}", field=field) from None
    if not isinstance(schema, dict):
        raise InvalidRequest("the schema must be a JSON object", field=field)
    return schema


def reply_constraint(plan: ToolPlan) -> Constraint | None:
    """The constraint an active plan's replies are held to (None: not held)."""
    if plan.schema is None:
        return None
    return ("tool_frames" if plan.format.native else "json_schema"), json.dumps(plan.schema)


def with_preamble(messages: Sequence[ChatMessage], plan: ToolPlan) -> list[ChatMessage]:
    """The conversation as rendered with tools: the preamble is the system message, after
    an existing first system message's text."""
    assert plan.schema is not None
    text = preamble(plan.tools, plan.schema)
    if messages and messages[0].role == "system":
        return [ChatMessage("system", messages[0].content + "\n\n" + text), *messages[1:]]
    return [ChatMessage("system", text), *messages]

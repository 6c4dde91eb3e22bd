"""A gRPC session's tools: `SessionConfig.tools`, `tool_choice` and `parallel_tool_calls` →
the engine's `ToolPlan`, and the constraint its replies are held to.

With an active plan the reply is held to the plan's JSON schema (a call or an answer); a
`json_schema` or `json_object` constraint becomes what the answer must follow, as OpenAI's
response_format does beside tools. Other constraint kinds cannot hold a reply that may
call tools: INVALID_ARGUMENT naming them.
"""

from __future__ import annotations

import json

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.errors import InvalidRequest
from ..engine.engine import Tool, ToolChoice, ToolPlan, plan_tools, reply_constraint

_MODES = {
    pb.ToolChoice.MODE_NONE: "none",
    pb.ToolChoice.MODE_AUTO: "auto",
    pb.ToolChoice.MODE_REQUIRED: "required",
    pb.ToolChoice.MODE_FUNCTION: "function",
}


def _choice(config: pb.SessionConfig) -> ToolChoice:
    mode = config.tool_choice.mode
    if mode == pb.ToolChoice.MODE_UNSPECIFIED:
        return ToolChoice("auto" if config.tools else "none")
    if mode not in _MODES:
        raise InvalidRequest(f"unknown mode {mode}", field="config.tool_choice.mode")
    return ToolChoice(_MODES[mode], config.tool_choice.function_name)


def _answer_schema(constraint: tuple[str, str] | None) -> dict[str, object] | None:
    if constraint is None:
        return None
    kind, text = constraint
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise InvalidRequest(f"a {kind} constraint cannot hold a reply that may call tools; use json_schema "
                             "or json_object, or tool_choice MODE_NONE", field=f"config.constraint.{kind}")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"the schema is not JSON: {exc}", field="config.constraint.json_schema") from None
    if not isinstance(schema, dict):
        raise InvalidRequest("the schema must be a JSON object", field="config.constraint.json_schema")
    return schema


def tool_plan(config: pb.SessionConfig,
              constraint: tuple[str, str] | None) -> tuple[ToolPlan | None, tuple[str, str] | None]:
    """The session's plan (None without tools) and the constraint to compile. With an active
    plan, a refusal of that constraint names `config.` + the plan's field."""
    if not config.tools and not config.HasField("tool_choice") and not config.parallel_tool_calls:
        return None, constraint
    tools = [Tool(t.name, t.description, t.parameters or '{"type": "object", "properties": {}}', t.strict)
             for t in config.tools]
    choice = _choice(config)
    answer = _answer_schema(constraint) if tools and choice.mode != "none" else None
    try:
        plan = plan_tools(tools, choice, config.parallel_tool_calls, answer)
    except InvalidRequest as exc:
        raise InvalidRequest(str(exc), field=f"config.{exc.field}" if exc.field else "config.tools") from None
    return plan, (reply_constraint(plan) if plan.active else constraint)

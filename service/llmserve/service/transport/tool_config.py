"""A gRPC session's tools: `SessionConfig.tools`, `tool_choice` and `parallel_tool_calls` →
the engine's `ToolPlan`, and the constraint its replies are held to.

With an active plan the reply is held to the plan's JSON schema (a call or an answer); a
`json_schema` or `json_object` constraint becomes what the answer must follow; other
constraint kinds are INVALID_ARGUMENT naming them (`session_tools`, the engine's rule).
"""

from __future__ import annotations

from llmserve.v1 import llmserve_pb2 as pb

from ..domain.errors import InvalidRequest
from ..engine.engine import Tool, ToolChoice, ToolFormat, ToolPlan, session_tools

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


def tool_plan(config: pb.SessionConfig, constraint: tuple[str, str] | None,
              tool_format: ToolFormat) -> tuple[ToolPlan | None, tuple[str, str] | None]:
    """The session's plan (None without tools) and the constraint to compile. With an active
    plan, a refusal of that constraint names `config.` + the plan's field."""
    if not config.tools and not config.HasField("tool_choice") and not config.parallel_tool_calls:
        return None, constraint
    tools = [Tool(t.name, t.description, t.parameters, t.strict) for t in config.tools]
    choice = _choice(config)
    field = f"constraint.{constraint[0]}" if constraint is not None else "constraint"
    try:
        return session_tools(tools, choice, config.parallel_tool_calls, constraint, field, tool_format)
    except InvalidRequest as exc:
        raise InvalidRequest(str(exc), field=f"config.{exc.field}" if exc.field else "config.tools") from None

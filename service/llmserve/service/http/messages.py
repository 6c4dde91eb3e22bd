"""A chat body's `messages` → the engine's `ChatMessage`s, or a 400 naming the field.

Roles: system (`developer` too: OpenAI's name for it in its newer models, which LangChain and
the Agents SDK send for those), user, assistant (with `tool_calls`, its content then
optional) and tool (with `tool_call_id`). The session renders calls and results in tool calling's generic
format (engine/chat/tools.py). A key sent as `null` counts as not sent (the SDK sends back a
reply's `refusal: null`).
"""

from __future__ import annotations

import json

from ..domain.events import ToolCall
from ..engine.engine import ChatMessage
from .errors import bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")
_KEYS = {"system": {"content"}, "developer": {"content"}, "user": {"content"}, "assistant": {"content", "tool_calls"},
         "tool": {"content", "tool_call_id"}}
SAME_AS = {"developer": "system"}  # OpenAI's name for the system role in its newer models


def parse_messages(value: object) -> list[ChatMessage]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty array", "messages")
    messages: list[ChatMessage] = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", where)
        m = {k: v for k, v in m.items() if v is not None}
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        for key in m:
            if key != "role" and key not in _KEYS[role]:
                raise bad_request(f"{where}.{key} is not supported by this server", f"{where}.{key}")
        calls: tuple[ToolCall, ...] = ()
        if role == "assistant" and "tool_calls" in m:
            calls = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
            content = content_text(m["content"], f"{where}.content") if "content" in m else ""
        else:
            if "content" not in m:
                raise bad_request(f"{where}.content is required", f"{where}.content")
            content = content_text(m["content"], f"{where}.content")
        if role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad_request(f"{where}.tool_call_id is required (a string)", f"{where}.tool_call_id")
        messages.append(ChatMessage(SAME_AS.get(role, role), content, calls, m.get("tool_call_id", "")))
    return messages


def _tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    """OpenAI's `[{"id", "type": "function", "function": {"name", "arguments"}}]` (arguments:
    JSON text that must parse)."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"{where} must be a non-empty array", where)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise bad_request(f"{at} must be a function call: {{\"type\": \"function\", \"function\": {{...}}}}", at)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{at}.function must be an object with a name", f"{at}.function")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise bad_request(f"{at}.function.arguments must be JSON text (a string)", f"{at}.function.arguments")
        try:
            json.loads(arguments)
        except ValueError as exc:
            raise bad_request(f"{at}.function.arguments is not JSON: {exc}", f"{at}.function.arguments") from None
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise bad_request(f"{at}.id must be a string", f"{at}.id")
        calls.append(ToolCall(call_id, function["name"], arguments))
    return tuple(calls)


def content_text(value: object, where: str) -> str:
    """A string, or an array of text parts (joined)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or an array of text parts", where)
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}] must be a text part: {{\"type\": \"text\", \"text\": \"...\"}} "
                              "(this server serves text only)", f"{where}[{j}]")
        if set(part) - {"type", "text"}:
            extra = sorted(set(part) - {"type", "text"})[0]
            raise bad_request(f"{where}[{j}].{extra} is not supported by this server", f"{where}[{j}].{extra}")
        texts.append(part["text"])
    return "".join(texts)

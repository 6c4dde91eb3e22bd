"""Tool calls and tool results in a conversation, as each tool format renders them: the
generic format flattens them into plain messages (a template without tools can render
those); a native format hands them to the template as OpenAI-shaped dicts, which the
model's own template writes in its syntax (tool_formats.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...domain.errors import Field, InvalidRequest
from .chat import ChatMessage


def call_arguments(messages: Sequence[ChatMessage]) -> list[list[Any]]:
    """Each message's calls' arguments, parsed; InvalidRequest naming the call whose
    arguments are not JSON."""
    parsed: list[list[Any]] = []
    for i, m in enumerate(messages):
        arguments = []
        for j, c in enumerate(m.tool_calls):
            try:
                arguments.append(json.loads(c.arguments))
            except ValueError as exc:
                raise InvalidRequest(f"the arguments are not JSON: {exc}",
                                     field=Field.MESSAGES.at(i, f"tool_calls[{j}].arguments")) from None
        parsed.append(arguments)
    return parsed


def as_generic_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """A conversation with tool calls and tool results, as plain messages a template
    without tools can render: an assistant's calls become its JSON reply, a tool's result
    a user message carrying `tool_response`. InvalidRequest when a call's arguments are
    not JSON."""
    plain: list[ChatMessage] = []
    for m, arguments in zip(messages, call_arguments(messages), strict=True):
        if m.tool_calls:
            calls = [{"name": c.name, "arguments": a} for c, a in zip(m.tool_calls, arguments, strict=True)]
            body = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
            plain.append(ChatMessage(m.role, json.dumps(body, ensure_ascii=False)))
        elif m.role == "tool":
            result = {"tool_response": {"tool_call_id": m.tool_call_id, "content": m.content}}
            plain.append(ChatMessage("user", json.dumps(result, ensure_ascii=False)))
        else:
            plain.append(ChatMessage(m.role, m.content))
    return plain


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as a template that renders tools takes them (Hugging Face's convention):
    an assistant's calls under `tool_calls` with their arguments as objects, a tool's result
    with its `tool_call_id`; keys a message does not use are left out (templates test
    `'tool_calls' in message`)."""
    rendered: list[dict[str, Any]] = []
    for m, arguments in zip(messages, call_arguments(messages), strict=True):
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": a}}
                                     for c, a in zip(m.tool_calls, arguments, strict=True)]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        rendered.append(message)
    return rendered

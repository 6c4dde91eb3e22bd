"""An Anthropic Messages body (`POST /v1/messages`, `/v1/messages/count_tokens`) → the chat
request the OpenAI wing already reads, or a 400 naming the Anthropic field.

This module checks the Messages shapes (roles, content blocks, `tools`, `tool_choice`,
`max_tokens` required as Anthropic requires it) and spells them the way
`/v1/chat/completions` does: `system` becomes a system message, a `tool_result` block a
tool message (before the user's text), an assistant's `tool_use` blocks its tool calls,
`stop_sequences` the stop strings, `tool_choice` any → required and tool → a named function,
`disable_parallel_tool_use` the inverse of `parallel_tool_calls`. `request.parse_chat`
then applies the shared rules. Fields that change nothing here (IGNORED; `cache_control`
on the request or any block: the prefix cache is automatic) are accepted;
`thinking` and `output_config.effort` change nothing for a model without reasoning
(accepted, as llama-server does), `output_config.format` is the chat route's
`response_format`, a `system` message among the turns joins the user text before it;
fields that would change the output and are not served (image and document blocks,
server tools, context edits other than clearing thinking) are refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog

from ..engine.engine import GENERIC, ToolFormat
from .errors import bad_request
from .fields import Body, body_of, integer
from .request import ChatRequest, parse_chat

IGNORED = frozenset({"metadata", "cache_control", "service_tier", "speed", "inference_geo"})  # change nothing here
log = structlog.get_logger("llmserve.http.anthropic")

FIELDS = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                    "top_k", "tools", "tool_choice", "thinking", "context_management", "output_config", *IGNORED})
THINKING = ("enabled", "disabled", "adaptive")  # the model has no reasoning: each changes nothing here
EFFORTS = ("low", "medium", "high", "max", "xhigh")  # how hard a reasoning model thinks: nothing here
# what a count reads; the rest of Anthropic's count_tokens fields are checked as /v1/messages checks them
COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "context_management",
                          "output_config", *IGNORED})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


@dataclass(frozen=True)
class MessagesRequest:
    chat: ChatRequest  # the same request as `/v1/chat/completions` reads it
    model: str | None
    stream: bool


def parse_messages_request(value: object, tool_format: ToolFormat = GENERIC) -> MessagesRequest:
    body = body_of(value, FIELDS)
    for name in IGNORED.intersection(body):
        log.debug("field_ignored", field=name, route="/v1/messages")
    if "max_tokens" not in body:
        raise bad_request("max_tokens is required", "max_tokens")
    max_tokens = integer(body, "max_tokens")
    chat: Body = {"messages": chat_messages(body), "max_tokens": max_tokens}
    for name in ("temperature", "top_p", "top_k", "stream", "model"):
        if name in body:
            chat[name] = body[name]
    if "stop_sequences" in body:
        chat["stop"] = _strings(body["stop_sequences"], "stop_sequences")
    chat.update(_tools(body))
    _thinking(body)
    chat.update(_output_config(body))
    request = parse_chat(chat, tool_format)
    return MessagesRequest(request, request.model, request.stream)


def _thinking(body: Body) -> None:
    """`thinking` and `context_management`'s thinking edits: checked, and changing nothing (no
    thinking blocks come from a model without reasoning; there are none to clear)."""
    if "thinking" in body:
        thinking = body["thinking"]
        if not isinstance(thinking, dict) or thinking.get("type") not in THINKING:
            raise bad_request(f"thinking must be an object with type {', '.join(THINKING)}", "thinking.type")
        _only(thinking, "thinking", ("type", "budget_tokens", "display"))
        budget = thinking.get("budget_tokens", 1024)
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise bad_request("thinking.budget_tokens must be an integer", "thinking.budget_tokens")
    if "context_management" in body:
        edits = body["context_management"].get("edits", []) if isinstance(body["context_management"], dict) else None
        if not isinstance(edits, list):
            raise bad_request("context_management must be an object with an edits array", "context_management")
        for i, edit in enumerate(edits):
            kind = edit.get("type") if isinstance(edit, dict) else None
            if not isinstance(kind, str) or not kind.startswith("clear_thinking"):  # clearing tool uses changes the prompt
                raise bad_request(f"context_management.edits[{i}].type {kind!r} is not supported by this server "
                                  "(clear_thinking edits are: there is no thinking to clear)",
                                  f"context_management.edits[{i}].type")


def _output_config(body: Body) -> Body:
    """`output_config`: `effort` changes nothing here; `format` (a JSON schema) is served as
    the chat route's `response_format`."""
    config = body.get("output_config", {})
    if not isinstance(config, dict):
        raise bad_request("output_config must be an object", "output_config")
    _only(config, "output_config", ("effort", "format"))
    if config.get("effort", "high") not in EFFORTS:
        raise bad_request(f"output_config.effort must be one of {', '.join(EFFORTS)}", "output_config.effort")
    form = config.get("format")
    if form is None:
        return {}
    if not isinstance(form, dict) or form.get("type") != "json_schema" or not isinstance(form.get("schema"), dict):
        raise bad_request("output_config.format must be {type: json_schema, schema: {...}}", "output_config.format")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}}


def parse_count_request(value: object, tool_format: ToolFormat = GENERIC) -> ChatRequest:
    """`/v1/messages/count_tokens`: the messages, system and tools a request would render
    (thinking and output_config change no prompt here: checked, then left out)."""
    body = body_of(value, COUNT_FIELDS)
    _thinking(body)
    _output_config(body)
    return parse_chat({"messages": chat_messages(body), **_tools(body), **{k: body[k] for k in ("model",) if k in body}},
                      tool_format)


def chat_messages(body: Body) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if "system" in body:
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty array", "messages")
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise bad_request(f"{where} must be an object with role user, assistant or system", f"{where}.role")
        for key in message:
            if key not in ("role", "content"):
                raise bad_request(f"{where}.{key} is not supported by this server", f"{where}.{key}")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if message["role"] == "system":
            _system_turn(messages, "".join(_text_block(block, at) for at, block in blocks))
        else:
            messages += _user(blocks, where) if message["role"] == "user" else [_assistant(blocks, where)]
    return messages


def _system_turn(messages: list[dict[str, Any]], text: str) -> None:
    """A system message among the turns (Claude Code sends its environment so): joined to the
    user message before it, as chat templates take system text only first."""
    if messages and messages[-1]["role"] == "user":
        messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n\n{text}"}
    else:
        messages.append({"role": "user", "content": text})


def _blocks(content: object, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, block) for each content block; a string is one text block."""
    if isinstance(content, str):
        return [(where, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or an array of content blocks", where)
    blocks = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{at} must be a content block with a type", f"{at}.type")
        blocks.append((at, block))
    return blocks


def _user(blocks: list[tuple[str, dict[str, Any]]], where: str) -> list[dict[str, Any]]:
    """Tool results first (each a tool message), then the text as one user message."""
    results, texts = [], []
    for at, block in blocks:
        if block["type"] == "tool_result":
            _only(block, at, ("type", "tool_use_id", "content", "is_error", "cache_control"))
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request(f"{at}.tool_use_id must be a string", f"{at}.tool_use_id")
            content = _text(block.get("content", ""), f"{at}.content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": f"Error: {content}" if block.get("is_error") is True else content})
        else:
            texts.append(_text_block(block, at))
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _assistant(blocks: list[tuple[str, dict[str, Any]]], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for at, block in blocks:
        if block["type"] in ("thinking", "redacted_thinking"):
            continue  # a reasoning model's, sent back: this model renders none
        if block["type"] == "tool_use":
            _only(block, at, ("type", "id", "name", "input", "cache_control"))
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad_request(f"{at} needs a string id and name", f"{at}.id")
            if not isinstance(block.get("input", {}), dict):
                raise bad_request(f"{at}.input must be an object", f"{at}.input")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        else:
            texts.append(_text_block(block, at))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    return {**message, "tool_calls": calls} if calls else message


def _text_block(block: dict[str, Any], at: str) -> str:
    if block["type"] != "text":
        raise bad_request(f"{at}.type {block['type']!r} is not supported by this server (text, tool_use and "
                          "tool_result blocks are)", f"{at}.type")
    _only(block, at, ("type", "text", "cache_control", "citations"))
    if not isinstance(block.get("text"), str):
        raise bad_request(f"{at}.text must be a string", f"{at}.text")
    return block["text"]


def _text(value: object, where: str) -> str:
    """A string, or text blocks joined (system prompts, tool results)."""
    if isinstance(value, str):
        return value
    return "".join(_text_block(block, at) for at, block in _blocks(value, where))


def _only(block: dict[str, Any], at: str, keys: tuple[str, ...]) -> None:
    for key in block:
        if key not in keys:
            raise bad_request(f"{at}.{key} is not supported by this server", f"{at}.{key}")


def _strings(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_request(f"{name} must be an array of strings", name)
    return list(value)


def _tools(body: Body) -> Body:
    """`tools` and `tool_choice` in the chat body's spelling."""
    chat: Body = {}
    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise bad_request("tools must be an array", "tools")
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(body["tools"])]
    if "tool_choice" in body:
        choice = body["tool_choice"]
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in (*_TOOL_CHOICES, "tool"):
            raise bad_request("tool_choice must be an object with type auto, any, tool or none", "tool_choice")
        _only(choice, "tool_choice", ("type", "name", "disable_parallel_tool_use"))
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise bad_request("tool_choice.name is required with type tool", "tool_choice.name")
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            chat["tool_choice"] = _TOOL_CHOICES[kind]
        disable = choice.get("disable_parallel_tool_use", False)
        if not isinstance(disable, bool):
            raise bad_request("tool_choice.disable_parallel_tool_use must be a boolean",
                              "tool_choice.disable_parallel_tool_use")
        chat["parallel_tool_calls"] = not disable
    return chat


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise bad_request(f"{where} must be an object with a name", f"{where}.name")
    if tool.get("type") not in (None, "custom"):  # server tools (web search, code execution, ...) run at Anthropic
        raise bad_request(f"{where}.type {tool['type']!r} is not supported by this server (custom tools are)",
                          f"{where}.type")
    _only(tool, where, ("type", "name", "description", "input_schema", "cache_control"))
    function = {"name": tool["name"], "parameters": tool.get("input_schema", {"type": "object"})}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}

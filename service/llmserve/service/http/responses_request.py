"""An OpenAI Responses body (`POST /v1/responses`) → the chat request the wing already reads,
or a 400 naming the Responses field.

`input` (a string, or items: messages with roles user, assistant, system or developer and
`input_text` / `output_text` parts, `function_call`, `function_call_output`) and
`instructions` become chat messages (developer = system; a function call joins the
assistant message before it; an output is a tool message); function `tools`, `tool_choice`,
`parallel_tool_calls`, `text.format` (text, json_object, json_schema) and
`max_output_tokens` are spelled as `/v1/chat/completions` spells them, whose rules then
apply; `store` and `previous_response_id` are the route's (agent_routes.py). Fields that
change nothing here (IGNORED) are accepted; fields that would change the output and are not
served (`include` items, other tool types, image and file parts) are refused by name.
`background` runs the turn as a task (background.py), not with `stream`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from ..engine.engine import GENERIC, ToolFormat
from .errors import bad_request
from .fields import Body, body_of, integer
from .request import ChatRequest, parse_chat

log = structlog.get_logger("llmserve.http.responses")

IGNORED = frozenset({"metadata", "client_metadata", "reasoning", "user", "service_tier", "prompt_cache_key",
                     "prompt_cache_retention", "safety_identifier", "stream_options", "truncation"})
FIELDS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                    "max_output_tokens", "temperature", "top_p", "stream", "include", "store", "previous_response_id",
                    "background", "top_logprobs", *IGNORED})
# `include` items that add nothing here (no reasoning to encrypt); the Agents SDK sends `include: []`
INCLUDES_IGNORED = ("reasoning.encrypted_content",)
INCLUDE_LOGPROBS = "message.output_text.logprobs"  # each output_text token's logprob (and `top_logprobs`)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


# chat's names of the fields a Responses body spells otherwise, most specific first: an error names the body's own
CHAT_SPELLINGS = (("response_format.json_schema.schema", "text.format.schema"),
                  ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
                  ("max_tokens", "max_output_tokens"))


def responses_param(param: str | None) -> str | None:
    """An error's `param` as the Responses body spells it (chat's rules named it)."""
    for chat, body in CHAT_SPELLINGS:
        if param is not None and (param == chat or param.startswith((f"{chat}.", f"{chat}["))):
            return body + param[len(chat):]
    return param


@dataclass(frozen=True)
class ResponsesRequest:
    chat: ChatRequest  # its messages: the instructions (if any), then the input's
    body: Body  # the fields the response object echoes (instructions, tools, ...)
    store: bool = True  # keep the turn, to be continued by id (OpenAI's default)
    previous_id: str | None = None  # the stored turn this one continues
    items: tuple[dict[str, Any], ...] = ()  # the input as `input_items` lists it
    background: bool = False  # answered `queued` at once; the turn runs as a task (background.py)

    @property
    def model(self) -> str | None:
        return self.chat.model

    @property
    def num_instructions(self) -> int:
        """How many of `chat.messages` are the instructions (not carried into a continuation)."""
        return 1 if "instructions" in self.body else 0


def parse_responses_request(value: object, tool_format: ToolFormat = GENERIC) -> ResponsesRequest:
    body = body_of(value, FIELDS)
    for name in IGNORED.intersection(body):
        log.debug("field_ignored", field=name, route="/v1/responses")
    if body.get("truncation", "disabled") != "disabled":
        raise bad_request("truncation must be disabled: a slot's context is a hard limit here", "truncation")
    if "input" not in body:
        raise bad_request("input is required", "input")
    logprobs = _includes(body.get("include", []))
    messages = [{"role": "system", "content": _string(body["instructions"], "instructions")}] \
        if "instructions" in body else []
    chat: Body = {"messages": messages + _input(body["input"])}
    for name in ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "tool_choice"):
        if name in body:
            chat[name] = _tool_choice(body[name]) if name == "tool_choice" else body[name]
    if "max_output_tokens" in body:
        chat["max_tokens"] = integer(body, "max_output_tokens")
    if logprobs or "top_logprobs" in body:  # top_logprobs alone asks for them too
        chat["logprobs"] = True
        chat |= {"top_logprobs": body["top_logprobs"]} if "top_logprobs" in body else {}
    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise bad_request("tools must be an array", "tools")
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(body["tools"])]
    if "text" in body:
        chat.update(_text_format(body["text"]))
    store, background = (_boolean(body, name, default) for name, default in (("store", True), ("background", False)))
    if background and not store:
        raise bad_request("a background response is stored: send store true (or leave it out)", "background")
    if background and body.get("stream"):
        raise bad_request("a background response is not streamed here: poll GET /v1/responses/{id}", "background")
    previous = _string(body["previous_response_id"], "previous_response_id") if "previous_response_id" in body else None
    return ResponsesRequest(parse_chat(chat, tool_format), body, store, previous, _items(body["input"]), background)


def _boolean(body: Body, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean", name)
    return value


def _items(value: object) -> tuple[dict[str, Any], ...]:
    """The input as items with ids (a string is one user message; text parts as input_text)."""
    items = [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else list(value)  # type: ignore[arg-type]
    listed = []
    for i, item in enumerate(items):
        item = {"type": "message", **item, "id": item.get("id") or f"item_{i}"}
        if item["type"] == "message" and isinstance(item.get("content"), str):
            item["content"] = [{"type": "input_text", "text": item["content"]}]
        listed.append(item)
    return tuple(listed)


def _includes(value: object) -> bool:
    """Whether `include` asks for the output's logprobs; any other item it cannot serve is a 400."""
    if not isinstance(value, list):
        raise bad_request("include must be an array", "include")
    for i, item in enumerate(value):
        if item not in (*INCLUDES_IGNORED, INCLUDE_LOGPROBS):
            raise bad_request(f"include[{i}] {item!r} is not supported by this server", f"include[{i}]")
    return INCLUDE_LOGPROBS in value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{where} must be a string", where)
    return value


def _input(value: object) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("input must be a string or a non-empty array of items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            _only(item, where, ("type", "role", "content", "id", "status"))
            if item.get("role") not in ROLES:
                raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
            messages.append({"role": ROLES[item["role"]], "content": _parts(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            _only(item, where, ("type", "call_id", "name", "arguments", "id", "status"))
            call = {"id": _string(item.get("call_id"), f"{where}.call_id"), "type": "function", "function": {
                "name": _string(item.get("name"), f"{where}.name"),
                "arguments": _string(item.get("arguments", "{}"), f"{where}.arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            _only(item, where, ("type", "call_id", "output", "id", "status"))
            messages.append({"role": "tool", "tool_call_id": _string(item.get("call_id"), f"{where}.call_id"),
                             "content": _parts(item.get("output"), f"{where}.output")})
        else:
            raise bad_request(f"{where}.type {kind!r} is not supported by this server (message, function_call and "
                              "function_call_output are)", f"{where}.type")
    return messages


def _parts(value: object, where: str) -> str:
    """A string, or text parts (`input_text`, `output_text`) joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or an array of parts", where)
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
            kind = part.get("type") if isinstance(part, dict) else None
            raise bad_request(f"{at}.type {kind!r} is not supported by this server (input_text and output_text "
                              "are)", f"{at}.type")
        _only(part, at, ("type", "text", "annotations", "logprobs"))
        texts.append(_string(part.get("text"), f"{at}.text"))
    return "".join(texts)


def _only(item: dict[str, Any], where: str, keys: tuple[str, ...]) -> None:
    for key in item:
        if key not in keys:
            raise bad_request(f"{where}.{key} is not supported by this server", f"{where}.{key}")


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise bad_request(f"{where}.type {kind!r} is not supported by this server (function tools are)",
                          f"{where}.type")
    _only(tool, where, ("type", "name", "description", "parameters", "strict"))
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool and tool[k] is not None}
    return {"type": "function", "function": function}


def _tool_choice(value: object) -> object:
    """`{"type": "function", "name": n}` is chat's `{"type": "function", "function": {"name": n}}`."""
    if isinstance(value, dict) and value.get("type") == "function" and "name" in value:
        return {"type": "function", "function": {"name": value["name"]}}
    return value


def _text_format(value: object) -> Body:
    if not isinstance(value, dict):
        raise bad_request("text must be an object", "text")
    _only(value, "text", ("format", "verbosity"))
    fmt = value.get("format", {"type": "text"})
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("text.format.type must be text, json_object or json_schema", "text.format.type")
    if fmt["type"] == "text":
        return {}
    if fmt["type"] == "json_object":
        return {"response_format": {"type": "json_object"}}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"response_format": {"type": "json_schema", "json_schema": schema}}


def echo(body: Body) -> Body:
    """What the response object repeats of the request."""
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls", False),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "text": body.get("text", {"format": {"type": "text"}}), "truncation": "disabled",
            "store": body.get("store", True), "previous_response_id": body.get("previous_response_id"),
            "reasoning": None, "user": body.get("user"), "background": body.get("background", False)}

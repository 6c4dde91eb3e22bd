"""A `/v1/chat/completions` body → the engine's values, or a 400 naming the field.

This module only reads JSON: types, shapes, which fields exist. The fields map onto our
own names in plain mappings (sampling, stopping, output), and the rules both surfaces
share (domain/request_rules.py) turn those into `SessionParams`, naming a refused field
as OpenAI does (our names are OpenAI's). A field this
wing does not serve is refused by name, never ignored; a field sent as `null` counts as
not sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..domain import request_rules
from ..domain.model_meta import Limits
from ..domain.requests import SessionParams
from ..engine.engine import GENERIC, ChatMessage, ToolFormat
from . import fields, structured, tool_calls
from .adapters import LoraRef, lora_field
from .errors import bad_request
from .messages import parse_messages
from .structured import Constraint
from .tool_calls import ToolPlan

SURFACE = "http"  # SessionParams.surface of every route of this wing: the metrics' `surface` label
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
            "frequency_penalty")
_SAME: request_rules.FieldName = lambda name: name  # noqa: E731
NAMES = request_rules.FieldNames(session=lambda name: "x-request-id" if name == "request_id" else name,
                                 sampling=_SAME, stopping=_SAME, output=_SAME)
FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens", "stop", "seed",
    "logit_bias", "logprobs", "top_logprobs", "user", "min_tokens", "ignore_eos", *SAMPLING,
    "response_format", *structured.EXTENSIONS, *tool_calls.FIELDS, "lora", "deterministic",
})


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[ChatMessage]
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    n: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # our names; only what the body set
    stopping: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)
    constraint: Constraint | None = None  # compiled before the session opens
    tools: ToolPlan | None = None  # active: the reply is parsed for tool calls
    deadline: float | None = None  # time.monotonic() by which the turn ends (x-request-timeout)
    lora: tuple[LoraRef, ...] = ()  # llama-server's per-request adapters (http/adapters.py)

    def session_params(self, request_id: str, limits: Limits) -> SessionParams:
        return request_rules.session_params(request_id, limits, NAMES, self.sampling, self.stopping, self.output,
                                            num_samples=self.n)


def parse_chat(body: object, tool_format: ToolFormat = GENERIC) -> ChatRequest:
    """A chat body; its tools planned in `tool_format` (the engine's)."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}
    for name in body:
        if name not in FIELDS:
            raise bad_request(f"{name} is not supported by this server", name)
    if "messages" not in body:
        raise bad_request("messages is required", "messages")
    sampling = fields.sampling_values(body, SAMPLING)
    stopping = fields.stop_values(body)
    max_tokens = {name: fields.integer(body, name) for name in ("max_completion_tokens", "max_tokens") if name in body}
    if len(set(max_tokens.values())) > 1:
        raise bad_request("max_tokens and max_completion_tokens differ: send one", "max_tokens")
    if max_tokens:
        stopping["max_tokens"] = next(iter(max_tokens.values()))
    logprobs = fields.boolean(body, "logprobs") if "logprobs" in body else False
    output: dict[str, Any] = {}
    if "top_logprobs" in body:
        if not logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        output["top_logprobs"] = fields.integer(body, "top_logprobs")
    elif logprobs:
        output["top_logprobs"] = 0  # the sampled token's logprob only
    stream = fields.boolean(body, "stream") if "stream" in body else False
    include_usage = False
    if "stream_options" in body:
        include_usage = fields.include_usage(body["stream_options"], stream)
    if "user" in body and not isinstance(body["user"], str):
        raise bad_request("user must be a string", "user")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    messages = parse_messages(body["messages"])
    asked = structured.parse_format(body)
    tools, constraint = tool_calls.parse_tools(body, asked, tool_format)
    return ChatRequest(model, messages, stream, include_usage, logprobs,
                       fields.integer(body, "n") if "n" in body else None, sampling, stopping, output, constraint, tools,
                       lora=lora_field(body["lora"]) if "lora" in body else ())

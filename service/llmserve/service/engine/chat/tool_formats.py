"""Tool-call formats: the generic one (tools.py: JSON a grammar holds the whole reply to,
for templates that do not declare tools) and the formats native to model families, for
chat templates that render `tools` themselves and whose models were trained to call in
their own syntax:

    hermes        <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>  (Hermes 2 Pro/3,
                  Qwen 2.5/3, QwQ), one block per call, after optional text
    llama3        {"name": ..., "parameters": {...}}  as the whole reply, optionally after
                  <|python_tag|>  (Llama 3.1/3.2/3.3); one call
    mistral       [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]  (Mistral Nemo,
                  7B v0.3); after optional text
    mistral-args  [TOOL_CALLS]name[ARGS]{...} per call  (Mistral Small 3.2, Devstral)

`--tool-format auto` (the default) picks one by what the template writes
(`detect`); a template without any of them gets the generic format. With a native
format the template renders the tools and the calls (`template_messages`,
`template_tools`), native_reply.py reads the reply, and tools.py's `call_frames` is the
grammar a reply that must call is held to: a call's arguments always parse, and with `strict`
validate, against its tool's schema. A reply that may answer (`tool_choice` auto) is not
held to a grammar in a native format: its calls are read from whatever the model writes.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolFormat:
    """How tools reach the model and how its calls read. `opening`: the text that starts
    the calls ("" : the reply itself is the call); `closing`: what ends each call;
    `arguments_key`: the call object's key for the arguments; `array`: the calls are one
    JSON array after `opening`; `args_tag`: `name[ARGS]{...}` after `opening`, per call;
    `call_id_length`: the template wants ids of this many alphanumerics (0: any id);
    `special_tags`: the tags are special tokens, which a reply must show to be read;
    `opening_is_token`: `opening` is one token of the model's vocabulary, so a reply that
    may answer is held to the frames from that token on (a lazy grammar; set by the engine
    from its vocabulary)."""

    name: str
    opening: str = ""
    closing: str = ""
    arguments_key: str = "arguments"
    array: bool = False
    args_tag: bool = False
    call_id_length: int = 0
    special_tags: bool = False
    opening_is_token: bool = False

    @property
    def native(self) -> bool:
        return self.name != "generic"

    def new_call_id(self) -> str:
        if self.call_id_length:
            return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(self.call_id_length))
        return "call_" + secrets.token_hex(12)


GENERIC = ToolFormat("generic")
FORMATS = {
    "generic": GENERIC,
    "hermes": ToolFormat("hermes", opening="<tool_call>", closing="</tool_call>"),
    "llama3": ToolFormat("llama3", opening="<|python_tag|>", arguments_key="parameters", special_tags=True),
    "mistral": ToolFormat("mistral", opening="[TOOL_CALLS]", array=True, call_id_length=9, special_tags=True),
    "mistral-args": ToolFormat("mistral-args", opening="[TOOL_CALLS]", args_tag=True, call_id_length=9,
                               special_tags=True),
}


def detect(template_source: str) -> ToolFormat:
    """The format a chat template's own tool rendering shows; generic when none is known.
    (Templates that write `<tool_call>` with XML arguments, as Qwen3-Coder's and GLM's,
    are not hermes.)"""
    if "<tool_call>" in template_source and "<function=" not in template_source and "<arg_key>" not in template_source:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template_source:
        return FORMATS["mistral-args"] if "[ARGS]" in template_source else FORMATS["mistral"]
    if "Environment: ipython" in template_source and '"parameters"' in template_source:
        return FORMATS["llama3"]
    return GENERIC


def choose(name: str, template_source: str | None) -> ToolFormat:
    """`--tool-format`: a named format, or `auto` (`detect` on the template, if any)."""
    if name != "auto":
        return FORMATS[name]
    return detect(template_source) if template_source else GENERIC


def template_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Tools as chat templates take them (OpenAI's function-tool shape)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": json.loads(t.parameters)}} for t in tools]

"""Chat templates: the GGUF's `tokenizer.chat_template` (or `--chat-template-file`)
rendered with jinja2 in a sandbox, as Hugging Face transformers does.

A session that uses chat messages keeps the whole conversation on the server (a
`Conversation`); each turn the client sends only its new messages, the server appends
the assistant's replies, renders everything again, and the slot allocator reuses the KV
prefix the previous rendering left, so only the new tokens are prefilled.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ...domain.errors import Field, InvalidRequest
from ...domain.events import ToolCall

MAX_MESSAGES = 1024
SavedChat = tuple[tuple[str, str], ...]  # (role, content) pairs, as a named session keeps them


class TemplateError(ValueError):
    """The template itself (or the conversation, via raise_exception) was refused."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class ChatMessage:
    """A message as a client sends it: with tools, an assistant's calls or a tool's result
    (`tool_call_id`); the session renders those in the generic format (engine/chat/tools.py)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


# Templates shipped with the package for architectures whose GGUFs often carry none (the
# default model's does not): used when neither --chat-template-file nor the GGUF gives one.
PACKAGED_TEMPLATES = {"gemma3": Path(__file__).parent / "templates" / "gemma3.jinja"}


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    """Hugging Face's `tojson` (templates' tool listings): plain JSON, not jinja2's HTML-escaped one."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str, eos_token: str, origin: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self.source = source
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin  # "model", "file" or "packaged"

    @classmethod
    def from_file(cls, path: Path, bos_token: str, eos_token: str, origin: str = "file") -> ChatTemplate:
        return cls(path.read_text(encoding="utf-8"), bos_token, eos_token, origin)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text of messages as templates take them (`{"role", "content"}`, and with
        a native tool format `tool_calls` / `tool_call_id`: tool_messages.py), with `tools`
        when given; InvalidRequest when the template refuses the conversation."""
        extra = {"tools": tools} if tools is not None else {}
        try:
            return self._template.render(
                messages=messages,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template refused the conversation: {exc}", field=Field.MESSAGES) from None
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"the chat template failed: {exc}", field=Field.MESSAGES) from None

    def render_plain(self, messages: Sequence[ChatMessage]) -> str:
        """Messages of role and text rendered; when the template refuses their roles' order,
        the same conversation with one system message first and alternating roles."""
        try:
            return self.render(_plain(messages))
        except InvalidRequest:
            return self.render(_plain(alternating(messages)))


def alternating(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The conversation as templates that insist on one system message first and then
    alternating roles take it (Gemma's): the system messages' text first, as one; a run of
    messages of one role, as one (their texts a blank line apart). Agents send several
    developer messages, or two user messages in a row (Codex, Claude Code)."""
    system = [m.content for m in messages if m.role == "system"]
    merged: list[ChatMessage] = [ChatMessage("system", "\n\n".join(system))] if system else []
    for m in messages:
        if m.role == "system":
            continue
        if merged and merged[-1].role == m.role and merged[-1].role != "system":
            merged[-1] = ChatMessage(m.role, f"{merged[-1].content}\n\n{m.content}")
        else:
            merged.append(ChatMessage(m.role, m.content))
    return merged


def _plain(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} for m in messages]


class Conversation:
    """A chat session's conversation: its messages, the reply under way, and messages that
    arrived mid-reply (deferred: rendered once the reply is in the history).

    The session's handle writes it on the event-loop thread; the executor reads `saved()`
    when it saves a named session, which may be before the stream closes (a deadline, a
    fault, shutdown). So `saved()` and every write hold a lock."""

    def __init__(self, saved: SavedChat | None = None) -> None:
        self._lock = threading.Lock()
        self._messages: list[ChatMessage] | None = None if saved is None else [ChatMessage(r, c) for r, c in saved]
        self._reply: list[str] = []  # sample 0's text of the running turn
        self._answering = False  # a reply is under way
        self._deferred: list[tuple[list[ChatMessage], bool]] = []

    @property
    def started(self) -> bool:
        """The session uses chat messages (sent, or restored from a saved chat session)."""
        return self._messages is not None

    @property
    def num_deferred_turns(self) -> int:
        """Deferred messages that end a turn: turns queued behind the running reply."""
        return sum(end_of_turn for _, end_of_turn in self._deferred)

    def check(self, messages: list[ChatMessage]) -> None:
        """InvalidRequest unless the messages may join: roles set, at most MAX_MESSAGES in all."""
        if not messages:
            raise InvalidRequest("messages must not be empty", field=Field.MESSAGES)
        num_held = len(self._messages or ()) + sum(len(m) for m, _ in self._deferred)
        if num_held + len(messages) > MAX_MESSAGES:
            raise InvalidRequest(f"a session holds at most {MAX_MESSAGES} messages", field=Field.MESSAGES)
        for i, m in enumerate(messages):
            if not m.role:
                raise InvalidRequest("every message needs a role", field=Field.MESSAGES.at(i, "role"))

    def defer(self, messages: list[ChatMessage], end_of_turn: bool) -> None:
        self._deferred.append((messages, end_of_turn))

    def next_deferred(self) -> tuple[list[ChatMessage], bool] | None:
        return self._deferred.pop(0) if self._deferred else None

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred)

    def add(self, messages: list[ChatMessage], end_of_turn: bool) -> list[ChatMessage]:
        """Append the messages; the whole conversation to render as the turn's input."""
        with self._lock:
            if self._messages is None:
                self._messages = []
            self._messages.extend(messages)
            return list(self._messages)

    def begin_reply(self) -> None:
        """A turn starts: what sample 0 streams is the reply."""
        with self._lock:
            self._answering = True

    def on_reply_text(self, text: str) -> None:
        """Sample 0 streamed `text` (the reply as the client sees it)."""
        with self._lock:
            self._reply.append(text)

    def end_reply(self) -> None:
        """Sample 0's turn ended: its reply joins the conversation."""
        with self._lock:
            if self._messages is not None:
                self._messages.append(ChatMessage("assistant", "".join(self._reply)))
            self._reply.clear()
            self._answering = False

    def saved(self) -> SavedChat | None:
        """What a named session keeps (None: not a chat session): a reply cut short as far as
        the client saw it; input never answered is dropped, so the next stream's messages
        alternate."""
        with self._lock:
            if self._messages is None:
                return None
            messages = list(self._messages)
            if self._answering and self._reply:
                messages.append(ChatMessage("assistant", "".join(self._reply)))
        while messages and messages[-1].role != "assistant":
            messages.pop()
        return tuple((m.role, m.content) for m in messages)

"""A generic-format reply (engine/chat/tools.py) read as it streams: the answer's text and the
tool calls as they form.

The reply is JSON the grammar holds to one of

    {"response": "..."}    {"tool_call": {"name": ..., "arguments": {...}}}    {"tool_calls": [...]}

so a reader of the partial text can tell, token by token, which it is. `ReplyReader.feed`
returns what is new since the last call: the answer's decoded text, and per call first
its head (index, id, name, as soon as the name is complete) and then fragments of its
arguments' JSON text exactly as the model wrote it. `finish` gives the whole `Reply`; its
content and arguments are the concatenation of what was streamed, so a streamed reply
and a whole one agree. A reply cut short (max_tokens, a deadline) keeps what was
streamed and has no finished calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...domain.events import ToolCall, ToolCallDelta
from .tools import Reply, new_call_id

_SPACE = " \t\n\r"
_SCALAR = set("+-0123456789.eEtrufalsn")


class _Partial(Exception):
    """The text ends inside the value being read."""


@dataclass
class _CallView:
    name: str | None = None  # once its string is complete
    arguments: tuple[int, int] | None = None  # raw span [start, end)
    arguments_closed: bool = False


@dataclass
class _View:
    """What the partial text shows so far."""

    kind: str = ""  # "response", "calls", "text" (not the format), or "" (not yet known)
    answer: tuple[int, int] | None = None  # the response value's raw span
    answer_closed: bool = False
    calls: list[_CallView] = field(default_factory=list)
    closed: bool = False  # the top-level object is complete (and nothing but space follows)


def _space(s: str, i: int) -> int:
    while i < len(s) and s[i] in _SPACE:
        i += 1
    if i >= len(s):
        raise _Partial
    return i


def _string_end(s: str, i: int) -> int:
    """`s[i]` opens a string: the index after its closing quote."""
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == '"':
            return j + 1
        j += 1
    raise _Partial


def _value_end(s: str, i: int) -> int:
    """The index after the JSON value that starts at `s[i]`; ValueError if it is not JSON."""
    c = s[i]
    if c == '"':
        return _string_end(s, i)
    if c in "{[":
        depth, j = 0, i
        while j < len(s):
            if s[j] == '"':
                j = _string_end(s, j)
                continue
            if s[j] in "{[":
                depth += 1
            elif s[j] in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise _Partial
    j = i
    while j < len(s) and s[j] in _SCALAR:
        j += 1
    if j == i:
        raise ValueError(f"not JSON at {i}")
    if j == len(s):
        raise _Partial  # a number may go on
    return j


def _members(s: str, i: int):  # type: ignore[no-untyped-def]
    """An object's members from its `{` at `s[i]`: yields (key, value start); the caller
    reads the value and sends back its end. Returns the index after `}`."""
    if s[i] != "{":
        raise ValueError("not an object")
    i += 1
    while True:
        i = _space(s, i)
        if s[i] == "}":
            return i + 1
        if s[i] == ",":
            i += 1
            continue
        if s[i] != '"':
            raise ValueError("a key must be a string")
        end = _string_end(s, i)
        key = json.loads(s[i:end])
        i = _space(s, end)
        if s[i] != ":":
            raise ValueError("':' expected")
        i = yield key, _space(s, i + 1)


def _read_call(s: str, i: int, call: _CallView) -> int:
    members = _members(s, i)
    try:
        key, at = next(members)
        while True:
            if key == "name":
                end = _value_end(s, at)
                call.name = json.loads(s[at:end])
            elif key == "arguments":
                call.arguments = (at, len(s))
                end = _value_end(s, at)
                call.arguments, call.arguments_closed = (at, end), True
            else:
                end = _value_end(s, at)
            key, at = members.send(end)
    except StopIteration as done:
        return int(done.value)


def _scan(s: str, view: _View) -> None:
    members = _members(s, _space(s, 0))
    try:
        key, at = next(members)
    except StopIteration:
        view.closed = True  # {}
        return
    while True:
        if key == "response":
            view.kind, view.answer = "response", (at, len(s))
            end = _value_end(s, at)
            view.answer, view.answer_closed = (at, end), True
        elif key == "tool_call":
            view.kind = "calls"
            view.calls.append(_CallView())
            end = _read_call(s, at, view.calls[-1])
        elif key == "tool_calls":
            view.kind = "calls"
            if s[at] != "[":
                raise ValueError("tool_calls must be an array")
            end = at + 1
            while True:
                end = _space(s, end)
                if s[end] == "]":
                    end += 1
                    break
                if s[end] == ",":
                    end += 1
                    continue
                view.calls.append(_CallView())
                end = _read_call(s, end, view.calls[-1])
        else:
            end = _value_end(s, at)
        try:
            key, at = members.send(end)
        except StopIteration as done:
            view.closed = s[int(done.value):].strip() == ""
            return


def _view(text: str) -> _View:
    view = _View()
    try:
        _scan(text, view)
    except _Partial:
        pass
    except (ValueError, IndexError):
        view.kind = "text"  # not the format (no grammar held it): plain text
    return view


def _string_prefix(raw: str, closed: bool) -> str:
    """The decoded text of a (possibly unfinished) JSON string, up to its last whole character."""
    body = raw[1:-1] if closed else raw[1:]
    for cut in range(0, min(len(body), 12) + 1):
        try:
            text = json.loads('"' + body[: len(body) - cut] + '"')
        except ValueError:
            continue
        if not closed and text and "\ud800" <= text[-1] <= "\udbff":
            text = text[:-1]  # half of a surrogate pair: wait for the other half
        return str(text)
    return ""


class ReplyReader:
    """Reads one sample's reply as it streams (see the module docstring)."""

    def __init__(self) -> None:
        self._text = ""
        self._answer_sent = 0  # characters of the answer already returned
        self._calls: list[tuple[str, str]] = []  # (id, name) of each call whose head was returned
        self._arguments_sent: list[int] = []

    def feed(self, text: str) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """The reply's next text → (new answer text, new call deltas)."""
        self._text += text
        view = _view(self._text)
        answer = ""
        if view.kind == "text":
            answer, self._answer_sent = self._text[self._answer_sent:], len(self._text)
        elif view.kind == "response" and view.answer is not None:
            start, end = view.answer
            raw = self._text[start:end]
            whole = _string_prefix(raw, view.answer_closed) if raw.startswith('"') else raw
            answer, self._answer_sent = whole[self._answer_sent:], max(self._answer_sent, len(whole))
        deltas: list[ToolCallDelta] = []
        for k, call in enumerate(view.calls if view.kind == "calls" else ()):
            if call.name is None:
                break  # calls stream in order: a later call waits for this one's head
            if k == len(self._calls):
                self._calls.append((new_call_id(), call.name))
                self._arguments_sent.append(0)
                deltas.append(ToolCallDelta(k, self._calls[k][0], call.name, ""))
            if call.arguments is not None:
                start, end = call.arguments
                fragment = self._text[start + self._arguments_sent[k]:end]
                if fragment:
                    self._arguments_sent[k] += len(fragment)
                    deltas.append(ToolCallDelta(k, "", "", fragment))
        return answer, tuple(deltas)

    def finish(self) -> Reply:
        """The whole reply. A finished call needs its arguments complete; a reply that is not
        the format at all (no grammar held it) is its text."""
        view = _view(self._text)
        if view.kind == "calls" and view.closed and all(c.arguments_closed for c in view.calls):
            calls = []
            for (call_id, name), call in zip(self._calls, view.calls, strict=True):
                assert call.arguments is not None
                calls.append(ToolCall(call_id, name, self._text[call.arguments[0]:call.arguments[1]]))
            return Reply(None, tuple(calls))
        if view.kind == "response" and view.answer is not None:
            start, end = view.answer
            raw = self._text[start:end]
            return Reply(_string_prefix(raw, view.answer_closed) if raw.startswith('"') else raw)
        if view.kind == "text" or (view.kind == "" and view.closed):
            return Reply(self._text)
        return Reply("")  # calls cut short, or a reply cut before its kind was known


def parse_reply(text: str) -> Reply:
    """A finished generic-format reply: its tool calls (each with a new id) or its answer."""
    reader = ReplyReader()
    reader.feed(text)
    return reader.finish()

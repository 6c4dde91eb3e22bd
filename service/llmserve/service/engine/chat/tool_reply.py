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

from collections.abc import Callable
from dataclasses import dataclass, field

from ...domain.events import ToolCall, ToolCallDelta
from .json_scan import CallView, Partial, members, read_call, read_calls, skip_space, string_prefix, value_end
from .tools import Reply, new_call_id


@dataclass
class _View:
    """What the partial text shows so far."""

    kind: str = ""  # "response", "calls", "text" (not the format), or "" (not yet known)
    answer: tuple[int, int] | None = None  # the response value's raw span
    answer_closed: bool = False
    calls: list[CallView] = field(default_factory=list)
    closed: bool = False  # the top-level object is complete (and nothing but space follows)


def _scan(s: str, view: _View) -> None:
    reader = members(s, skip_space(s, 0))
    try:
        key, at = next(reader)
    except StopIteration:
        view.closed = True  # {}
        return
    while True:
        if key == "response":
            view.kind, view.answer = "response", (at, len(s))
            end = value_end(s, at)
            view.answer, view.answer_closed = (at, end), True
        elif key == "tool_call":
            view.kind = "calls"
            view.calls.append(CallView())
            end = read_call(s, at, view.calls[-1])
        elif key == "tool_calls":
            view.kind = "calls"
            end = read_calls(s, at, view.calls)
        else:
            end = value_end(s, at)
        try:
            key, at = reader.send(end)
        except StopIteration as done:
            view.closed = s[int(done.value):].strip() == ""
            return


def _view(text: str) -> _View:
    view = _View()
    try:
        _scan(text, view)
    except Partial:
        pass
    except (ValueError, IndexError):
        view.kind = "text"  # not the format (no grammar held it): plain text
    return view


class CallStreamer:
    """The calls of one reply as deltas: each call's head (index, a new id, its name) once its
    name is complete, then fragments of its arguments' raw JSON text. Calls stream in order:
    a later call waits for this one's head. `new_id` makes the ids (the format's shape)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._heads: list[tuple[str, str]] = []  # (id, name) of each call whose head was returned
        self._arguments_sent: list[int] = []

    def deltas(self, text: str, calls: list[CallView]) -> list[ToolCallDelta]:
        """What `calls`, as read from `text`, add since the last call."""
        deltas: list[ToolCallDelta] = []
        for k, call in enumerate(calls):
            if call.name is None:
                break
            if k == len(self._heads):
                self._heads.append((self._new_id(), call.name))
                self._arguments_sent.append(0)
                deltas.append(ToolCallDelta(k, self._heads[k][0], call.name, ""))
            if call.arguments is not None:
                start, end = call.arguments
                fragment = text[start + self._arguments_sent[k]:end]
                if fragment:
                    self._arguments_sent[k] += len(fragment)
                    deltas.append(ToolCallDelta(k, "", "", fragment))
        return deltas

    def finished(self, text: str, calls: list[CallView]) -> tuple[ToolCall, ...] | None:
        """The whole calls, with the ids streamed; None unless every call's arguments closed."""
        if not calls or not all(c.arguments_closed and c.arguments is not None for c in calls):
            return None
        self.deltas(text, calls)  # heads of calls not yet fed
        return tuple(ToolCall(call_id, name, text[c.arguments[0]:c.arguments[1]])  # type: ignore[index]
                     for (call_id, name), c in zip(self._heads, calls, strict=True))


class ReplyReader:
    """Reads one sample's reply as it streams (see the module docstring)."""

    def __init__(self) -> None:
        self._text = ""
        self._answer_sent = 0  # characters of the answer already returned
        self._calls = CallStreamer()

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
            whole = string_prefix(raw, view.answer_closed) if raw.startswith('"') else raw
            answer, self._answer_sent = whole[self._answer_sent:], max(self._answer_sent, len(whole))
        calls = self._calls.deltas(self._text, view.calls) if view.kind == "calls" else []
        return answer, tuple(calls)

    def flush(self) -> str:
        """The reply ended: nothing is held back in this format (its answer is a JSON string)."""
        return ""

    def finish(self) -> Reply:
        """The whole reply. A finished call needs its arguments complete; a reply that is not
        the format at all (no grammar held it) is its text."""
        view = _view(self._text)
        if view.kind == "calls" and view.closed:
            calls = self._calls.finished(self._text, view.calls)
            if calls is not None:
                return Reply(None, calls)
            return Reply("")
        if view.kind == "response" and view.answer is not None:
            start, end = view.answer
            raw = self._text[start:end]
            return Reply(string_prefix(raw, view.answer_closed) if raw.startswith('"') else raw)
        if view.kind == "text" or (view.kind == "" and view.closed):
            return Reply(self._text)
        return Reply("")  # calls cut short, or a reply cut before its kind was known


def parse_reply(text: str) -> Reply:
    """A finished generic-format reply: its tool calls (each with a new id) or its answer."""
    reader = ReplyReader()
    reader.feed(text)
    return reader.finish()

"""A reply in a model family's own tool-call syntax (tool_formats.py), read as it streams:
the answer's text and the calls as they form, as tool_reply.py does for the generic format.

The text outside the calls is the answer, returned as it comes except for a tail that may
be the start of the format's opening tag (held back until the next text shows whether it
is; `flush` returns it when the reply ends). Inside the calls, each call's head comes as
soon as its name is complete, then fragments of its arguments' JSON exactly as the model
wrote it, so streamed deltas concatenate to the whole reply's calls. A call cut short
(max_tokens, a deadline) is not a finished call; text that is not the syntax after an
opening tag stays answer text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...domain.events import ToolCallDelta
from .json_scan import CallView, Partial, read_call, read_calls, skip_space, value_end
from .tool_formats import ToolFormat
from .tool_reply import CallStreamer
from .tools import Reply

_ARGS = "[ARGS]"
_HEAD = re.compile(r"([A-Za-z0-9_-]{1,64})(?:\[CALL_ID\][A-Za-z0-9]{1,64})?")
_HEAD_PREFIX = re.compile(r"[A-Za-z0-9_\-\[\]]{0,160}")  # what may still become a head and [ARGS]


@dataclass
class _View:
    """What the text shows so far: the answer (text outside the calls) and the calls."""

    answer: str = ""
    calls: list[CallView] = field(default_factory=list)
    held: str = ""  # answer text that may be the start of an opening tag


def _held_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` are a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _read_named(s: str, i: int, calls: list[CallView]) -> int:
    """`name[ARGS]{...}` at `s[i]` (the mistral-args syntax; `name[CALL_ID]id[ARGS]` as its
    template writes a call back): the index after it."""
    k = s.find(_ARGS, i)
    if k < 0:
        if not _HEAD_PREFIX.fullmatch(s[i:]):
            raise ValueError("not a call")
        raise Partial
    head = _HEAD.fullmatch(s[i:k])
    if head is None:
        raise ValueError("not a call")
    call = CallView(name=head.group(1))
    calls.append(call)
    at = skip_space(s, k + len(_ARGS))
    call.arguments = (at, len(s))
    end = value_end(s, at)
    call.arguments, call.arguments_closed = (at, end), True
    return end


def _read_calls(fmt: ToolFormat, s: str, i: int, calls: list[CallView]) -> int:
    """The calls that follow an opening tag ending at `i`: the index after them (after the
    closing tag where the format has one). Partial: the text ends inside them."""
    if fmt.args_tag:
        return _read_named(s, i, calls)
    i = skip_space(s, i)
    if fmt.array:
        return read_calls(s, i, calls, fmt.arguments_key)
    calls.append(CallView())
    end = read_call(s, i, calls[-1], fmt.arguments_key)
    if calls[-1].name is None or not calls[-1].arguments_closed:
        raise ValueError("not a call")
    if not fmt.closing:
        return end
    end = skip_space(s, end)
    if not s.startswith(fmt.closing, end):
        if fmt.closing.startswith(s[end:]):
            raise Partial
        raise ValueError("no closing tag")
    return end + len(fmt.closing)


_NOT_SYNTAX = (ValueError, IndexError)  # json.JSONDecodeError is a ValueError


def _scan_whole(fmt: ToolFormat, s: str) -> _View:
    """A format whose call is the whole reply (llama3): `{...}`, or after `opening`."""
    view = _View()
    start = len(s) - len(s.lstrip())
    rest = s[start:]
    if fmt.opening.startswith(rest):  # nothing yet, or part of the tag
        view.held = s
        return view
    if rest.startswith(fmt.opening):
        start += len(fmt.opening)
    elif not rest.startswith("{"):
        view.answer = s
        return view
    try:
        _read_calls(fmt, s, start, view.calls)
    except Partial:
        view.held = s  # a call, or JSON that is not one: known when it closes
    except _NOT_SYNTAX:
        view.calls, view.answer = [], s
    return view


def _scan(fmt: ToolFormat, s: str) -> _View:
    if not fmt.closing and not fmt.array and not fmt.args_tag:
        return _scan_whole(fmt, s)
    view, pos = _View(), 0
    while True:
        k = s.find(fmt.opening, pos)
        if k < 0:
            held = _held_tail(s[pos:], fmt.opening)
            view.answer += s[pos:len(s) - held]
            view.held = s[len(s) - held:]
            return view
        view.answer += s[pos:k]
        num_calls = len(view.calls)
        try:
            pos = _read_calls(fmt, s, k + len(fmt.opening), view.calls)
            pos = len(s) - len(s[pos:].lstrip())  # space between calls is not answer text
        except Partial:
            return view
        except _NOT_SYNTAX:
            del view.calls[num_calls:]  # not the syntax: the tag is text
            view.answer += fmt.opening
            pos = k + len(fmt.opening)


class NativeReader:
    """Reads one sample's reply in `fmt` as it streams (see the module docstring)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self._fmt = fmt
        self._text = ""
        self._answer_sent = 0
        self._calls = CallStreamer(fmt.new_call_id)

    def feed(self, text: str) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """The reply's next text → (new answer text, new call deltas)."""
        self._text += text
        view = _scan(self._fmt, self._text)
        answer = view.answer[self._answer_sent:]
        self._answer_sent = max(self._answer_sent, len(view.answer))
        return answer, tuple(self._calls.deltas(self._text, view.calls))

    def flush(self) -> str:
        """The reply ended: the answer text held back as a possible opening tag."""
        view = _scan(self._fmt, self._text)
        whole = view.answer + view.held if not any(c.name for c in view.calls) else view.answer
        rest, self._answer_sent = whole[self._answer_sent:], max(self._answer_sent, len(whole))
        return rest

    def finish(self) -> Reply:
        """The whole reply: its answer (None when there is none beside calls) and its calls,
        when every call is complete."""
        view = _scan(self._fmt, self._text)
        calls = self._calls.finished(self._text, view.calls)
        answer = view.answer + (view.held if not any(c.name for c in view.calls) else "")
        if calls is None:
            return Reply(answer)
        return Reply(answer if answer.strip() else None, calls)


def parse_native(fmt: ToolFormat, text: str) -> Reply:
    """A finished reply in `fmt`: its answer and its calls (each with a new id)."""
    reader = NativeReader(fmt)
    reader.feed(text)
    return reader.finish()

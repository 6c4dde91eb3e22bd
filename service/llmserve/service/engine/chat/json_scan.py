"""Reading JSON as it streams: where a value ends in a partial text, a tool call's name and
the raw span of its arguments, and a partial string's decoded prefix. The tool-reply
readers (tool_reply.py: the generic format; native_reply.py: the formats of model
families) read a reply with these, again from its start on each new piece of text."""

from __future__ import annotations

import json
import re
from collections.abc import Generator
from dataclasses import dataclass

_SPACE = " \t\n\r"
_SCALAR = set("+-0123456789.eEtrufalsn")
# A reply is read again from its start on each new piece (on the event loop): strings and
# containers are skipped by regular expressions, not a Python loop per character.
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_STRUCTURE = re.compile(r'["{}\[\]]')


class Partial(Exception):
    """The text ends inside the value being read."""


@dataclass
class CallView:
    """A call as the partial text shows it."""

    name: str | None = None  # once its string is complete
    arguments: tuple[int, int] | None = None  # raw span [start, end)
    arguments_closed: bool = False


def skip_space(s: str, i: int) -> int:
    """The index of the first non-space character at or after `i` (Partial: none yet)."""
    while i < len(s) and s[i] in _SPACE:
        i += 1
    if i >= len(s):
        raise Partial
    return i


def string_end(s: str, i: int) -> int:
    """`s[i]` opens a string: the index after its closing quote."""
    j = _STRING_BODY.match(s, i + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string
    if j >= len(s) or s[j] != '"':  # the text ends in the string, or inside an escape
        raise Partial
    return j + 1


def value_end(s: str, i: int) -> int:
    """The index after the JSON value that starts at `s[i]`; ValueError if it is not JSON."""
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth, j = 0, i
        while True:
            found = _STRUCTURE.search(s, j)
            if found is None:
                raise Partial
            j = found.start()
            if s[j] == '"':
                j = string_end(s, j)
                continue
            depth += 1 if s[j] in "{[" else -1
            if depth == 0:
                return j + 1
            j += 1
    j = i
    while j < len(s) and s[j] in _SCALAR:
        j += 1
    if j == i:
        raise ValueError(f"not JSON at {i}")
    if j == len(s):
        raise Partial  # a number may go on
    return j


def members(s: str, i: int) -> Generator[tuple[str, int], int, int]:
    """An object's members from its `{` at `s[i]`: yields (key, value start); the caller
    reads the value and sends back its end. Returns the index after `}`."""
    if s[i] != "{":
        raise ValueError("not an object")
    i += 1
    while True:
        i = skip_space(s, i)
        if s[i] == "}":
            return i + 1
        if s[i] == ",":
            i += 1
            continue
        if s[i] != '"':
            raise ValueError("a key must be a string")
        end = string_end(s, i)
        key = json.loads(s[i:end])
        i = skip_space(s, end)
        if s[i] != ":":
            raise ValueError("':' expected")
        i = yield key, skip_space(s, i + 1)


def read_call(s: str, i: int, call: CallView, arguments_key: str = "arguments") -> int:
    """The call object at `s[i]` read into `call` (its arguments under `arguments_key`);
    the index after it. Partial when the text ends inside it (`call` holds what was seen)."""
    reader = members(s, i)
    try:
        key, at = next(reader)
        while True:
            if key == "name":
                end = value_end(s, at)
                call.name = json.loads(s[at:end])
            elif key == arguments_key:
                call.arguments = (at, len(s))
                end = value_end(s, at)
                call.arguments, call.arguments_closed = (at, end), True
            else:
                end = value_end(s, at)
            key, at = reader.send(end)
    except StopIteration as done:
        return int(done.value)


def read_calls(s: str, i: int, calls: list[CallView], arguments_key: str = "arguments") -> int:
    """The array of call objects at `s[i]`, each read into a `CallView` appended to `calls`;
    the index after its `]`. Partial when the text ends inside it."""
    if s[i] != "[":
        raise ValueError("the calls must be an array")
    i += 1
    while True:
        i = skip_space(s, i)
        if s[i] == "]":
            return i + 1
        if s[i] == ",":
            i += 1
            continue
        calls.append(CallView())
        i = read_call(s, i, calls[-1], arguments_key)


def string_prefix(raw: str, closed: bool) -> str:
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

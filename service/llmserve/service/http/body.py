"""A request's JSON body → a Python value, every hostile byte a 4xx naming what is wrong.

| what the client sent | answer |
|---|---|
| a body over `--max-message-bytes` | 413 (aiohttp's `client_max_size`, surface.py) |
| a `Content-Type` charset other than UTF-8 (JSON is UTF-8: RFC 8259 §8.1) | 415, param `Content-Type` |
| bytes that are not UTF-8, text that is not JSON | 400 |
| arrays and objects nested deeper than `MAX_JSON_DEPTH` | 400, param: the top-level field |
| a string or key holding a lone surrogate (`"\\ud800"`: legal JSON, not Unicode text) | 400, param: its field, e.g. `messages[0].content` |

A lone surrogate is refused rather than replaced: the text the model would see is not
what the client sent. Bodies over `LARGE_BODY_BYTES` are decoded, checked and read into
a request (the route's `parse`) on the engine's offload pool, never on the event loop
that serves every client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from ..engine.engine import Engine
from .errors import ApiError, bad_request

T = TypeVar("T")
MAX_JSON_DEPTH = 256  # a schema at request_rules.MAX_SCHEMA_DEPTH nests about twice as deep in JSON
LARGE_BODY_BYTES = 64 * 1024
UTF8 = ("utf-8", "utf8")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \uD800-\uDFFF; pairs decode to one character
_SURROGATE = re.compile("[\ud800-\udfff]")


async def parsed_body(request: web.Request, engine: Engine, parse: Callable[[object], T]) -> T:
    """`parse(body)` of the request's JSON body, checked as the table above says; off the
    event loop when the body is large (Overloaded, a 429, when that pool is full)."""
    charset = request.charset
    if charset is not None and charset.lower() not in UTF8:
        raise ApiError(415, f"the body's charset is {charset!r}; JSON bodies are UTF-8", param="Content-Type")
    raw = await request.read()
    return await engine.off_loop(len(raw), _parse_raw, raw, parse, large=LARGE_BODY_BYTES)


def _parse_raw(raw: bytes, parse: Callable[[object], T]) -> T:
    return parse(json_value(raw))


def json_value(raw: bytes) -> object:
    """The body as JSON: UTF-8, nested at most MAX_JSON_DEPTH deep, no lone surrogates."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the body is not UTF-8 (byte {exc.start}): JSON bodies are UTF-8") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise bad_request(f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise bad_request(f"the body is not JSON: {exc}") from None
    check_value(value, surrogates=_SURROGATE_ESCAPE.search(raw) is not None)
    return value


def check_value(value: object, surrogates: bool = True) -> None:
    """400 naming the field when `value` nests deeper than MAX_JSON_DEPTH or (with
    `surrogates`) holds a lone surrogate in a string or key. Iterative: a deep value cannot
    exhaust the stack here."""
    stack: list[tuple[object, int, tuple[str | int, ...]]] = [(value, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if surrogates and (found := _SURROGATE.search(node)) is not None:
                raise _lone_surrogate(path, found.start(), node[found.start()])
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            top = str(path[0]) if path else None
            raise bad_request(f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels", top)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if surrogates and isinstance(key, str) and (found := _SURROGATE.search(key)) is not None:
                raise _lone_surrogate(path, found.start(), key[found.start()], key=key)
            stack.append((child, depth + 1, (*path, key)))


def field_name(path: tuple[str | int, ...]) -> str | None:
    """OpenAI's spelling of a JSON path: `messages[0].content`."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else part)
    return name or None


def _lone_surrogate(path: tuple[str | int, ...], at: int, char: str, key: str | None = None) -> ApiError:
    """The field is named; a key at fault is spelled with its surrogate escaped (`\\ud800`)."""
    if key is not None:
        path = (*path, key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))
    where = field_name(path)
    what = "the key" if key is not None else "the string"
    return bad_request(f"{what} at {where or 'the top level'} holds a lone surrogate (U+{ord(char):04X} at "
                       f"character {at}), which is not Unicode text: send valid UTF-16 pairs or UTF-8", where)

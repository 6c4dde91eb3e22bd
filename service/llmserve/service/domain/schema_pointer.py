"""Local `$ref`s of a JSON schema, one way for both readers of them: the strict check
(domain/schema_strict.py) and the grammar converter (model/grammar_sources.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote


def resolve_pointer(root: Any, ref: Any) -> Any:
    """The subschema a local `$ref` ("#" or "#/a/b": RFC 6901, with the fragment's %-escapes)
    points at; ValueError for any other reference or one that points at nothing."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise ValueError(f"$ref {ref!r}: only references within the schema (#/...) are supported")
    target = root
    for token in unquote(ref[1:]).split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            raise ValueError(f"$ref {ref!r} points at nothing in the schema")
    return target


def escape_token(token: str) -> str:
    """A JSON pointer's token for a key."""
    return token.replace("~", "~0").replace("/", "~1")

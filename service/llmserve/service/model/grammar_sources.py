"""Every constraint kind as GBNF, with llama-cpp-python's JSON-schema converter (what
llama-server uses): a JSON schema, a regular expression (the converter's pattern
translation, unquoted), one of several strings, any JSON object, or GBNF itself.
Runs in the grammar worker, under its CPU and memory budget: a hostile schema or
pattern can take that long to convert."""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import SchemaConverter, json_schema_to_gbnf

KINDS = ("grammar", "json_schema", "regex", "choice", "json_object")

# The converter's JSON string character admits raw control characters, which JSON forbids
# (JSON.parse and Python's json.loads refuse them); newer llama.cpp excludes them too.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def _strict_strings(gbnf: str) -> str:
    assert _LOOSE_CHAR in gbnf or "char ::=" not in gbnf, "the converter's string rule changed"
    return gbnf.replace(_LOOSE_CHAR, _JSON_CHAR)


def _converter(raw_pattern: bool = False) -> SchemaConverter:
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=raw_pattern)


def to_gbnf(kind: str, text: str) -> str:
    """`text`: GBNF, a JSON schema, a regex (anchored whole-output), a JSON list of strings
    (choice), or ignored (json_object). ValueError (or the converter's own) when it cannot."""
    if kind == "grammar":
        return text
    if kind == "json_schema":
        return _strict_strings(json_schema_to_gbnf(text))
    if kind == "json_object":
        return _strict_strings(json_schema_to_gbnf('{"type": "object"}'))
    converter = _converter(raw_pattern=True)
    if kind == "regex":
        pattern = text if text.startswith("^") else "^" + text
        pattern = pattern if pattern.endswith("$") and not pattern.endswith("\\$") else pattern + "$"
        converter._visit_pattern(pattern, "root")
        return converter.format_grammar()
    if kind == "choice":
        options = json.loads(text)
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise ValueError("choice must be a list of non-empty strings")
        literals = " | ".join(converter._format_literal(o) for o in options)
        return f"root ::= {literals}\n"
    raise ValueError(f"unknown constraint kind {kind!r}")

"""Every constraint kind as GBNF, with llama-cpp-python's JSON-schema converter (what
llama-server uses): a JSON schema, a regular expression (the converter's pattern
translation, unquoted), one of several strings, any JSON object, or GBNF itself.
Runs in the grammar worker, under its CPU and memory budget: a hostile schema or
pattern can take that long to convert. A schema's `$ref`s resolve within it (recursive
schemas too); one with a part that can never end (grammar_ends.py) is refused. What the
converter enforces of a schema, and what `strict` refuses: domain/schema_strict.py."""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, RESERVED_NAMES, SchemaConverter

from ..domain.schema_pointer import resolve_pointer
from .grammar_ends import unending_rules

# Keywords that say nothing about the value: a schema of these alone is any value.
_ANNOTATIONS = frozenset({"description", "title", "examples", "default", "$comment", "deprecated", "readOnly",
                          "writeOnly"})
KINDS = ("grammar", "json_schema", "regex", "choice", "json_object", "tool_frames")

# The converter's JSON string character admits raw control characters, which JSON forbids
# (JSON.parse and Python's json.loads refuse them); newer llama.cpp excludes them too.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
# Its \uXXXX escape admits a surrogate, half a character: a lone one does not encode as
# UTF-8, and a pair would count as two characters for minLength/maxLength while the string
# holds one. Characters beyond the BMP are written raw instead.
_ANY_ESCAPE = '"u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
_BMP_ESCAPE = '"u" ([0-9a-cA-CefEF] [0-9a-fA-F] | [dD] [0-7]) [0-9a-fA-F] [0-9a-fA-F])'


def _strict_strings(gbnf: str) -> str:
    assert _LOOSE_CHAR in gbnf or "char ::=" not in gbnf, "the converter's string rule changed"
    lines = gbnf.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(_LOOSE_CHAR):
            assert _ANY_ESCAPE in line, "the converter's escape rule changed"
            lines[i] = line.replace(_LOOSE_CHAR, _JSON_CHAR).replace(_ANY_ESCAPE, _BMP_ESCAPE)
    return "\n".join(lines)


class _Converter(SchemaConverter):
    """The converter with its `$ref`s read right. As shipped, it resolved only the
    references it met outside a referenced subschema (so a schema whose root is a `$ref`
    into its own `$defs`, as a recursive tree usually is, failed with a KeyError), and it
    named a reference's rule by the pointer's last segment, so two targets of one name, or
    a target named like a builtin rule or a property's rule, shared one rule. Here every
    local reference resolves (domain/schema_pointer.py, as the strict check reads it), and
    each target gets a rule of its own."""

    def __init__(self, raw_pattern: bool = False) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=raw_pattern)
        self._ref_rules: dict[str, str] = {}

    def resolve_refs(self, schema: dict, url: str) -> dict:  # type: ignore[type-arg]
        todo: list[object] = [schema]
        while todo:
            node = todo.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if ref is not None:
                    target = resolve_pointer(schema, ref)  # ValueError names what is wrong
                    node["$ref"] = f"{url}{ref}"
                    self._refs[node["$ref"]] = target
                todo.extend(node.values())
            elif isinstance(node, list):
                todo.extend(node)
        return schema

    def visit(self, schema: dict, name: str) -> str:  # type: ignore[type-arg]
        if isinstance(schema, dict) and schema and set(schema) <= _ANNOTATIONS:
            schema = {}  # annotations alone: any value (the converter knows only the empty schema so)
        return str(super().visit(schema, name))

    def _resolve_ref(self, ref: str) -> str:
        name = self._ref_rules.get(ref)
        if name is None:
            base = INVALID_RULE_CHARS_RE.sub("-", ref.split("/")[-1]).strip("-") or "ref"
            name, i = base, 0
            while name in RESERVED_NAMES or name in self._rules:
                name, i = f"{base}{i}", i + 1
            self._ref_rules[ref] = name
            self._rules[name] = ""  # held while its target (which may name it again) is visited
            self._rules[name] = self.visit(self._refs[ref], name)
        return name


def _schema_gbnf(text: str) -> str:
    converter = _Converter()
    converter.visit(converter.resolve_refs(json.loads(text), "schema"), "")
    return _checked(converter.format_grammar())


def _frames_gbnf(text: str) -> str:
    """Tool calls in a model's own syntax (engine/chat/tools.py `call_frames`): 1..max_calls
    frames `opening call closing` (newline apart) of one JSON schema, or with `named`,
    frames `opening name[ARGS]arguments`, each name with its arguments' schema."""
    document = json.loads(text)
    converter = _Converter()
    converter._rules["frame"] = ""  # held: no schema's rule may take these names
    literal = converter._format_literal
    if "named" in document:
        options = []
        for i, tool in enumerate(document["named"]):
            converter.visit(converter.resolve_refs(tool["schema"], f"tool{i}"), f"arguments-{i}")
            options.append(f"{literal(tool['name'] + '[ARGS]')} arguments-{i}")
        parts, separator = [literal(document["opening"]), f"({' | '.join(options)})"], ""
    else:
        converter.visit(converter.resolve_refs(document["schema"], "schema"), "call")
        parts = [literal(document["opening"])] if document["opening"] else []
        parts += ["call", literal(document["closing"])] if document["closing"] else ["call"]
        separator = literal("\n") + " "
    max_calls = int(document["max_calls"])
    converter._rules["frame"] = " ".join(parts)
    converter._rules["root"] = "frame" + (f" ({separator}frame){{0,{max_calls - 1}}}" if max_calls > 1 else "")
    return _checked(converter.format_grammar())


def _checked(gbnf: str) -> str:
    unending = unending_rules(gbnf)
    if unending:
        raise ValueError(f"the schema has no finite instance: its grammar's rules {', '.join(unending[:4])} never "
                         "end (a required property, or minItems, always leads back into itself)")
    return _strict_strings(gbnf)


def to_gbnf(kind: str, text: str) -> str:
    """`text`: GBNF, a JSON schema, a regex (anchored whole-output), a JSON list of strings
    (choice), or ignored (json_object). ValueError (or the converter's own) when it cannot."""
    if kind == "grammar":
        return text
    if kind == "json_schema":
        return _schema_gbnf(text)
    if kind == "json_object":
        return _schema_gbnf('{"type": "object"}')
    if kind == "tool_frames":
        return _frames_gbnf(text)
    converter = _Converter(raw_pattern=True)
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

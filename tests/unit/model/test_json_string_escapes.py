"""The JSON string character of every schema grammar (model/grammar_sources.py): no raw
control character, and no `\\uXXXX` escape of a surrogate (half a character: a lone one
does not encode as UTF-8, a pair would count twice for minLength)."""

from __future__ import annotations

import json
import re

from llmserve.service.model.grammar_sources import to_gbnf


def _escape_alternative(gbnf: str) -> re.Pattern[str]:
    """The char rule's `"u" ...` alternative as a Python regular expression."""
    char = next(line for line in gbnf.splitlines() if line.startswith("char ::="))
    rule = char.split('"u" ', 1)[1].rsplit(")", 1)[0]
    return re.compile(rule.replace(" ", ""))


def test_a_unicode_escape_is_any_code_unit_but_a_surrogate() -> None:
    for gbnf in (to_gbnf("json_object", ""), to_gbnf("json_schema", json.dumps({"type": "string", "minLength": 2}))):
        escape = _escape_alternative(gbnf)
        for unit in range(0x10000):
            for spelled in (f"{unit:04x}", f"{unit:04X}"):
                assert bool(escape.fullmatch(spelled)) is not (0xD800 <= unit <= 0xDFFF), spelled

"""Every constraint kind as GBNF (model/grammar_sources.py), parsed by llama.cpp's grammar
parser through the vocabulary-only model, as the grammar worker does."""

from __future__ import annotations

import json

import pytest
from llmserve.service.domain import request_rules as rules
from llmserve.service.domain.errors import InvalidRequest
from llmserve.service.model.grammar_sources import to_gbnf


def test_each_kind_becomes_gbnf_with_a_root() -> None:
    assert to_gbnf("regex", "[0-9]{3}-[0-9]{4}").startswith("root ::=")
    assert to_gbnf("regex", "^a|b$") == to_gbnf("regex", "a|b")  # anchors are implied
    choice = to_gbnf("choice", json.dumps(["yes", 'say "x"\n']))
    assert choice == 'root ::= "yes" | "say \\"x\\"\\n"\n'
    assert [line for line in to_gbnf("json_object", "").splitlines() if line.startswith("root ")] == ["root ::= object"]
    assert any(line.startswith("object ::= ") for line in to_gbnf("json_object", "").splitlines())
    assert to_gbnf("grammar", 'root ::= "x"') == 'root ::= "x"'


def test_json_strings_exclude_raw_control_characters() -> None:
    """JSON forbids them in strings (found: a json_object sample with a raw one did not parse)."""
    for gbnf in (to_gbnf("json_object", ""), to_gbnf("json_schema", '{"type": "string"}')):
        char = next(line for line in gbnf.splitlines() if line.startswith("char ::="))
        assert char.startswith('char ::= [^"\\\\\\x7F\\x00-\\x1F] |'), char


@pytest.mark.parametrize(("kind", "text"), [("choice", "[]"), ("choice", '["", "a"]'), ("choice", '"a"'),
                                            ("what", "x")])
def test_what_cannot_be_a_grammar_raises(kind: str, text: str) -> None:
    with pytest.raises(ValueError):
        to_gbnf(kind, text)


def test_the_rules_bound_choices_before_the_worker_sees_them() -> None:
    rules.check_constraint("choice", rules.choice_text(["a", "b"]), "choice")
    rules.check_constraint("json_object", "", "response_format")
    for options in ([], ["a", ""], ["x" * 2000], ["a"] * 300):
        with pytest.raises(InvalidRequest) as refused:
            rules.check_constraint("choice", rules.choice_text(options), "config.constraint.choice")
        assert refused.value.field == "config.constraint.choice"

"""Constraint kinds beyond GBNF and JSON schemas: a regex, a choice of strings, any JSON
object (issue 24 §5), on the real model over gRPC, sampled at temperature 0.8 so that the
grammar, not the model's habits, is what keeps the output in shape."""

from __future__ import annotations

import json
import re

import grpc
import pytest
from llmserve.client import Client, pb

from tests.helpers import generate_constrained, reply_text

PHONE = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["yes", "no", 'it "depends"']


def test_a_regex_holds_the_whole_output(server) -> None:  # type: ignore[no-untyped-def]
    for seed in range(4):
        responses = generate_constrained(server.address, pb.Constraint(regex=PHONE), seed=seed, prompt="Call me at")
        assert re.fullmatch(PHONE, reply_text(responses)), reply_text(responses)
        assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP


def test_a_choice_gives_exactly_one_of_the_strings(server) -> None:  # type: ignore[no-untyped-def]
    constraint = pb.Constraint(choice=pb.StringList(values=CHOICES))
    seen = set()
    for seed in range(6):
        text = reply_text(generate_constrained(server.address, constraint, seed=seed, prompt="Is water wet? Answer:"))
        assert text in CHOICES, text
        seen.add(text)
    assert seen  # at least one answer; which ones depends on the model


def test_json_object_is_any_json_object(server) -> None:  # type: ignore[no-untyped-def]
    """An object has no size limit, so a sampled one may run past max_tokens: then it is
    an object's beginning; a finished one parses to an object."""
    for seed in range(4):
        responses = generate_constrained(server.address, pb.Constraint(json_object=True), seed=seed, max_tokens=200)
        text = reply_text(responses)
        assert text.startswith("{"), text
        if responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP:
            assert isinstance(json.loads(text), dict)
        else:
            assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_LENGTH, text
    finished = []
    for seed in range(4):  # a short object to copy: some sample ends it (the checks above hold each)
        copied = generate_constrained(
            server.address, pb.Constraint(json_object=True), seed=seed, max_tokens=200,
            prompt='Repeat this JSON exactly: {"ok": true}\nJSON:'
        )
        if copied[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP:
            finished.append(json.loads(reply_text(copied)))
    assert finished and all(isinstance(value, dict) for value in finished)


@pytest.mark.parametrize("constraint,field", [
    (pb.Constraint(regex="(?=lookahead)x"), "config.constraint.regex"),
    (pb.Constraint(choice=pb.StringList(values=[])), "config.constraint.choice"),
    (pb.Constraint(choice=pb.StringList(values=["ok", ""])), "config.constraint.choice"),
    (pb.Constraint(regex=""), "config.constraint.regex"),
])
def test_bad_constraints_are_refused_by_field(server, constraint: pb.Constraint, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        generate_constrained(server.address, constraint)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert field in err.value.debug_error_string() or field.split(".")[-1] in err.value.details()
    with Client(server.address, timeout=30) as client:
        features = client.model_info().features
        assert features.regex and features.choice and features.json_object

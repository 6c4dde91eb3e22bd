"""Constrained output: GBNF grammars and JSON schemas, batched with ordinary requests."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from llmserve.client import Client, pb

from harness.metrics import metric
from tests.helpers import generate_constrained, reply_text

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


def test_gbnf_grammar_limits_the_output(server) -> None:  # type: ignore[no-untyped-def]
    grammar = 'root ::= ("yes" | "no") "."'
    for seed in range(3):
        responses = generate_constrained(
            server.address, pb.Constraint(grammar=grammar), seed=seed, prompt="Is water wet? Answer:"
        )
        assert reply_text(responses) in ("yes.", "no.")
        assert responses[-1].turn_end.finish_reason == pb.FINISH_REASON_STOP


def test_json_schema_output_always_parses_and_validates(server) -> None:  # type: ignore[no-untyped-def]
    constraint = pb.Constraint(json_schema=json.dumps(SCHEMA))
    for seed in range(10):
        responses = generate_constrained(server.address, constraint, seed=seed, max_tokens=200)
        end = responses[-1].turn_end
        assert end.finish_reason == pb.FINISH_REASON_STOP, (seed, reply_text(responses))
        value = json.loads(reply_text(responses))
        jsonschema.validate(value, SCHEMA)


@pytest.mark.parametrize(
    "constraint,field",
    [
        (pb.Constraint(grammar="root ::= (((("), "config.constraint.grammar"),
        (pb.Constraint(grammar='rule ::= "x"'), "config.constraint.grammar"),
        (pb.Constraint(json_schema="{not json"), "config.constraint.json_schema"),
    ],
)
def test_invalid_grammar_is_invalid_argument(server, constraint: pb.Constraint, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        generate_constrained(server.address, constraint)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    bad = error_details_pb2.BadRequest()
    assert status is not None and any(d.Unpack(bad) for d in status.details), "no BadRequest in the status"
    assert [v.field for v in bad.field_violations] == [field], err.value.details()
    with Client(server.address, timeout=30) as client:
        assert client.generate("Hi", max_tokens=2).turn_end.usage.completion_tokens == 2


def _steps(port: int) -> float:
    return metric(port, 'llmserve_step_duration_seconds_count{kind="generate"}')


def test_grammar_requests_batch_with_ordinary_ones(server) -> None:  # type: ignore[no-untyped-def]
    before = _steps(server.metrics_port)
    with ThreadPoolExecutor(2) as pool, Client(server.address, timeout=120) as client:
        ordinary = pool.submit(client.generate, "Tell me a story:", max_tokens=80, temperature=0, ignore_eos=True)
        constrained = pool.submit(
            generate_constrained, server.address, pb.Constraint(grammar="root ::= [a-z ]+"), max_tokens=80,
            ignore_eos=True
        )
        ordinary_tokens = ordinary.result().turn_end.usage.completion_tokens
        constrained_tokens = constrained.result()[-1].turn_end.usage.completion_tokens
    steps = _steps(server.metrics_port) - before
    print(f"{ordinary_tokens} + {constrained_tokens} tokens in {steps:.0f} decode steps")
    assert ordinary_tokens == 80 and constrained_tokens == 80
    assert steps < 0.75 * (ordinary_tokens + constrained_tokens)  # they shared decode steps

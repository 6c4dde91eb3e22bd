"""The shared request rules (domain/request_rules.py): one set of limits for both surfaces,
errors naming the field as each surface spells it. The gRPC adapter (transport/validation.py)
is checked here on protobuf messages; the real server's refusals in test_bad_input/test_fuzz."""

from __future__ import annotations

import math

import pytest
from llmserve.service.domain import request_rules as rules
from llmserve.service.domain.errors import InvalidRequest
from llmserve.service.domain.model_meta import Limits
from llmserve.service.transport import validation
from llmserve.v1 import llmserve_pb2 as pb

LIMITS = Limits(n_vocab=1000, n_ctx_per_slot=512)
BARE = rules.prefixed("")
OPENAI = rules.FieldNames(BARE, BARE, lambda name: {"stop_token_ids": "stop_token_ids"}.get(name, name), BARE)


def refusal(fn, *args, **kwargs) -> InvalidRequest:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest) as refused:
        fn(*args, **kwargs)
    return refused.value


@pytest.mark.parametrize(("field", "value"), [("temperature", -0.1), ("temperature", math.nan), ("top_p", 0.0),
                                              ("min_p", 1.5), ("presence_penalty", 2.5), ("dry_base", 0.5)])
def test_floats_out_of_range_are_refused_by_name(field: str, value: float) -> None:
    error = refusal(rules.sampling_params, {field: value}, LIMITS, BARE)
    assert error.field == field and field in str(error)


def test_ints_ids_and_biases_are_checked_against_the_limits() -> None:
    assert refusal(rules.sampling_params, {"top_k": 1001}, LIMITS, BARE).field == "top_k"
    assert refusal(rules.sampling_params, {"logit_bias": {1000: 1.0}}, LIMITS, BARE).field == "logit_bias[1000]"
    assert refusal(rules.sampling_params, {"logit_bias": {5: math.inf}}, LIMITS, BARE).field == "logit_bias[5]"
    assert refusal(rules.sampling_params, {"seed": rules.LLAMA_DEFAULT_SEED}, LIMITS, BARE).field == "seed"
    assert refusal(rules.stopping_params, {"max_tokens": 513}, LIMITS, BARE).field == "max_tokens"
    assert refusal(rules.stopping_params, {"stop": ("a", "")}, LIMITS, BARE).field == "stop[1]"
    assert refusal(rules.stopping_params, {"stop_token_ids": (1000,)}, LIMITS, BARE).field == "stop_token_ids"
    assert refusal(rules.output_params, {"top_logprobs": 21}, BARE).field == "top_logprobs"


def test_defaults_and_accepted_values() -> None:
    sampling = rules.sampling_params({"temperature": 0.0, "repeat_last_n": -1, "logit_bias": {7: -math.inf}}, LIMITS, BARE)
    assert sampling.temperature == 0.0 and sampling.repeat_last_n == 512 and sampling.logit_bias == ((7, -math.inf),)
    assert 0 <= sampling.seed < rules.LLAMA_DEFAULT_SEED  # unset: a random one, echoed back
    stopping = rules.stopping_params({"stop": ["x"], "max_tokens": 8}, LIMITS, BARE)
    assert (stopping.stop, stopping.max_tokens, stopping.min_tokens, stopping.ignore_eos) == (("x",), 8, 0, False)
    params = rules.session_params("r", LIMITS, OPENAI, {}, {}, {}, num_samples=2)
    assert params.num_samples == 2 and params.output.top_logprobs is None


def test_session_fields_are_checked_before_the_groups() -> None:
    error = refusal(rules.session_params, "r" * 200, LIMITS, OPENAI, {"temperature": -1.0}, {}, {})
    assert error.field == "request_id"
    assert refusal(rules.session_params, "r", LIMITS, OPENAI, {}, {}, {}, num_samples=9).field == "n"
    named = refusal(rules.session_params, "r", LIMITS, OPENAI, {}, {}, {}, num_samples=2, session_id="s")
    assert named.field == "n"
    # a client cannot name (and so read or overwrite) the KV the server saves for a stored response
    server_named = refusal(rules.session_params, "r", LIMITS, OPENAI, {}, {}, {}, session_id="stored-turn:resp_1")
    assert server_named.field == "session_id" and "server's own" in str(server_named)


def test_constraints_within_the_compilers_bounds() -> None:
    assert refusal(rules.check_constraint, "grammar", "", "grammar").field == "grammar"
    error = refusal(rules.check_constraint, "json_schema", '{"type": "array", "minItems": 100000000}', "response_format")
    assert "/minItems" in str(error) and error.field == "response_format"
    rules.check_constraint("json_schema", '{"type": "string", "pattern": "^a{3}$"}', "response_format")


def test_the_grpc_adapter_spells_fields_as_the_proto_does() -> None:
    config = pb.SessionConfig(n=2)
    config.sampling.top_k = 0  # an optional field set to its zero value still counts as set
    config.sampling.dry_sequence_breakers.values.append("x")
    config.sampling.logit_bias[3] = -1.0
    config.stopping.stop.append("end")
    params = validation.session_params(config, LIMITS, "r1")
    assert (params.sampling.top_k, params.sampling.dry_sequence_breakers, params.sampling.logit_bias) == (0, ("x",),
                                                                                                           ((3, -1.0),))
    assert params.stopping.stop == ("end",) and params.num_samples == 2
    config.sampling.top_p = 0.0
    assert refusal(validation.session_params, config, LIMITS, "r1").field == "config.sampling.top_p"
    config.ClearField("sampling")
    config.stopping.stop.append("")
    assert refusal(validation.session_params, config, LIMITS, "r1").field == "config.stopping.stop[1]"

"""Property-based fuzzing of every request field (hypothesis), split by what the values are:
valid values (each field within its documented range, max_tokens small so a call finishes
fast) are served OK within CALL_TIMEOUT, never DEADLINE_EXCEEDED, never refused; a valid
request with exactly one invalid value is INVALID_ARGUMENT, its google.rpc.BadRequest naming
that value's field; bytes that do not parse as the method's request (invalid UTF-8 in a
string field included) are INVALID_ARGUMENT."""

from __future__ import annotations

import json
import math

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from llmserve.client import Client, pb
from llmserve.client.errors import from_rpc_error
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tests.soak.plans import GRAMMARS, SCHEMAS

N_VOCAB = 262144  # gemma-3's vocabulary
N_CTX_PER_SLOT = 2048  # the `server` fixture: -np 8 -c 16384
MAX_SAMPLES = 8
CALL_TIMEOUT = 60.0  # a 4-token call, n up to 4, prompt logprobs on 64+ tokens, on a busy 2-core machine
FLOAT_RANGES = {  # name -> (low, high, low excluded), as transport/validation.py documents them
    "temperature": (0.0, 100.0, False), "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False),
    "repeat_penalty": (0.0, 10.0, True), "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False), "dynatemp_range": (0.0, 100.0, False),
    "dynatemp_exponent": (0.0, 100.0, False), "typical_p": (0.0, 1.0, True), "top_n_sigma": (0.0, 100.0, True),
    "xtc_probability": (0.0, 1.0, False), "xtc_threshold": (0.0, 0.5, False), "dry_multiplier": (0.0, 100.0, False),
    "dry_base": (1.0, 100.0, False), "mirostat_tau": (0.0, 100.0, False), "mirostat_eta": (0.0, 1.0, True),
}
INT_RANGES = {"top_k": (0, N_VOCAB), "repeat_last_n": (-1, N_CTX_PER_SLOT), "dry_allowed_length": (0, N_CTX_PER_SLOT),
              "dry_penalty_last_n": (-1, N_CTX_PER_SLOT), "mirostat": (0, 2)}
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
IN_VOCAB = st.integers(0, N_VOCAB - 1)
OUTSIDE_VOCAB = st.one_of(st.integers(-(2**31), -1), st.integers(N_VOCAB, 2**31 - 1))
TEXT = st.text(min_size=1, max_size=200)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _float_in(low: float, high: float, low_open: bool) -> st.SearchStrategy[float]:
    return st.floats(low, high, exclude_min=low_open, width=32)


def _float_outside(low: float, high: float, low_open: bool) -> st.SearchStrategy[float]:
    def invalid(x: float) -> bool:
        return not math.isfinite(x) or x < low or x > high or (low_open and x == low)

    return st.one_of(st.sampled_from([float("nan"), float("inf"), float("-inf")]),
                     st.floats(max_value=low, allow_infinity=False, width=32),
                     st.floats(min_value=high, allow_infinity=False, width=32)).filter(invalid)


def _int_outside(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(-(2**31), low - 1), st.integers(high + 1, 2**31 - 1))


@st.composite
def valid_generate_requests(draw):  # type: ignore[no-untyped-def]
    """A first message with every field drawn within its range, and one turn's input."""
    c = pb.SessionConfig(request_id=draw(st.text(max_size=128)), priority=draw(INT32))
    for name, bounds in FLOAT_RANGES.items():
        if draw(st.booleans()):
            setattr(c.sampling, name, draw(_float_in(*bounds)))
    for name, (low, high) in INT_RANGES.items():
        if draw(st.booleans()):
            setattr(c.sampling, name, draw(st.integers(low, high)))
    for token, bias in draw(st.dictionaries(IN_VOCAB, st.one_of(st.floats(-100, 100), st.just(float("-inf"))),
                                            max_size=4)).items():
        c.sampling.logit_bias[token] = bias
    if draw(st.booleans()):
        c.sampling.seed = draw(st.integers(0, 0xFFFFFFFE))
    c.stopping.max_tokens = draw(st.integers(1, 4))
    if draw(st.booleans()):
        c.stopping.min_tokens = draw(st.integers(0, c.stopping.max_tokens))
    c.stopping.stop.extend(draw(st.lists(st.text(min_size=1, max_size=20), max_size=4)))
    c.stopping.stop_token_ids.extend(draw(st.lists(IN_VOCAB, max_size=4)))
    c.stopping.ignore_eos = draw(st.booleans())
    if draw(st.booleans()):
        c.output.top_logprobs = draw(st.integers(0, 20))
    c.output.prompt_logprobs, c.output.include_special = draw(st.booleans()), draw(st.booleans())
    c.sampling.deterministic = draw(st.booleans()) and not c.output.prompt_logprobs  # they exclude each other
    if draw(st.booleans()):
        c.n = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["none", "grammar", "schema"]))
    if kind == "grammar":
        c.constraint.grammar = draw(st.sampled_from(sorted(GRAMMARS)))
    elif kind == "schema":
        c.constraint.json_schema = json.dumps(draw(st.sampled_from(SCHEMAS)))
    request = pb.GenerateRequest(config=c, end_of_turn=True)
    if draw(st.booleans()):
        request.input.text = draw(TEXT)
    else:
        request.input.tokens.ids.extend(draw(st.lists(IN_VOCAB, min_size=1, max_size=64)))
    return request


def _mutations(draw, r: pb.GenerateRequest) -> str:  # type: ignore[no-untyped-def]
    """Make one value of `r` invalid; returns the field the refusal must name."""
    c = r.config
    kind = draw(st.sampled_from(["float", "int", "bias_token", "bias_value", "seed", "max_tokens", "min_tokens",
                                 "stop_empty", "stop_long", "stop_many", "stop_id", "stop_ids_many", "top_logprobs", "n",
                                 "request_id", "grammar", "schema", "schema_bound", "empty_text", "empty_tokens",
                                 "token_outside", "deterministic", "adapter", "continue_from", "no_config"]))
    if kind == "float":
        name = draw(st.sampled_from(sorted(FLOAT_RANGES)))
        setattr(c.sampling, name, draw(_float_outside(*FLOAT_RANGES[name])))
        return f"config.sampling.{name}"
    if kind == "int":
        name = draw(st.sampled_from(sorted(INT_RANGES)))
        setattr(c.sampling, name, draw(_int_outside(*INT_RANGES[name])))
        return f"config.sampling.{name}"
    if kind in ("bias_token", "bias_value"):
        token = draw(OUTSIDE_VOCAB if kind == "bias_token" else IN_VOCAB)
        c.sampling.logit_bias[token] = draw(st.floats(-100, 100)) if kind == "bias_token" else draw(
            st.sampled_from([float("nan"), float("inf")]))
        return f"config.sampling.logit_bias[{token}]"
    simple = {"seed": ("sampling", "seed", st.just(0xFFFFFFFF), "config.sampling.seed"),
              "max_tokens": ("stopping", "max_tokens", _int_outside(1, N_CTX_PER_SLOT), "config.stopping.max_tokens"),
              "min_tokens": ("stopping", "min_tokens", _int_outside(0, c.stopping.max_tokens), "config.stopping.min_tokens"),
              "top_logprobs": ("output", "top_logprobs", _int_outside(0, 20), "config.output.top_logprobs"),
              "adapter": ("adapter", "name", st.text(min_size=1, max_size=40), "config.adapter"),  # none loaded
              "continue_from": ("", "continue_from", st.text(min_size=1, max_size=40), "config.continue_from")}
    if kind in simple:
        part, name, values, field = simple[kind]
        setattr(getattr(c, part) if part else c, name, draw(values))
        return field
    if kind in ("stop_empty", "stop_long"):
        at = draw(st.integers(0, min(len(c.stopping.stop), 15)))
        c.stopping.stop.insert(at, "" if kind == "stop_empty" else draw(st.text(min_size=257, max_size=300)))
        del c.stopping.stop[16:]
        return f"config.stopping.stop[{at}]"
    if kind == "stop_many":
        c.stopping.stop.extend(["x"] * (17 - len(c.stopping.stop)))
        return "config.stopping.stop"
    if kind == "stop_id":
        c.stopping.stop_token_ids.append(draw(OUTSIDE_VOCAB))
        return "config.stopping.stop_token_ids"
    if kind == "stop_ids_many":
        c.stopping.stop_token_ids.extend([5] * (17 - len(c.stopping.stop_token_ids)))
        return "config.stopping.stop_token_ids"
    if kind == "n":
        c.n = draw(_int_outside(1, MAX_SAMPLES))
        return "config.n"
    if kind == "request_id":
        c.request_id = draw(st.text(min_size=129, max_size=200))
        return "config.request_id"
    if kind == "deterministic":  # with prompt logprobs: the fixed chunks do not score every row
        c.sampling.deterministic = c.output.prompt_logprobs = True
        return "config.output.prompt_logprobs"
    if kind == "grammar":
        c.constraint.grammar = draw(st.sampled_from(["", "root ::= (((", "root ::= [a-", "root ::= undefined_rule"]))
        return "config.constraint.grammar"
    if kind == "schema":
        c.constraint.json_schema = draw(st.sampled_from(["", "{", "not json"]))
        return "config.constraint.json_schema"
    if kind == "schema_bound":
        c.constraint.json_schema = json.dumps({"type": "array", "minItems": draw(st.integers(1001, 10**9))})
        return "config.constraint.json_schema"
    if kind == "empty_text":
        r.input.text = ""
        return "input.text"
    if kind == "empty_tokens":
        r.input.tokens.CopyFrom(pb.TokenIds())
        return "input.tokens.ids"
    if kind == "token_outside":
        r.input.tokens.ids.extend([draw(IN_VOCAB), draw(OUTSIDE_VOCAB)])
        return "input.tokens.ids"
    r.ClearField("config")
    return "config"


@st.composite
def invalid_generate_requests(draw):  # type: ignore[no-untyped-def]
    request = draw(valid_generate_requests())
    return request, _mutations(draw, request)


def _outcome(server, request: pb.GenerateRequest) -> tuple[str, tuple[str, ...], list[pb.GenerateResponse]]:  # type: ignore[no-untyped-def]
    """The status, the fields its BadRequest names, and the responses."""
    responses: list[pb.GenerateResponse] = []
    with grpc.insecure_channel(server.address) as channel:
        try:
            responses.extend(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=CALL_TIMEOUT))
            return "OK", (), responses
        except grpc.RpcError as err:
            e = from_rpc_error(err)
            return e.code().name, tuple(f for f, _ in e.field_violations), responses


@SETTINGS
@given(request=valid_generate_requests())
def test_valid_generate_requests_are_served(server, request: pb.GenerateRequest) -> None:  # type: ignore[no-untyped-def]
    status, fields, responses = _outcome(server, request)
    assert status == "OK", (status, fields, request)
    ends = [r.turn_end for r in responses if r.HasField("turn_end")]
    assert sorted(e.index for e in ends) == list(range(max(request.config.n, 1))), request
    assert all(e.usage.completion_tokens <= request.config.stopping.max_tokens for e in ends)


@SETTINGS
@given(case=invalid_generate_requests())
def test_an_invalid_value_is_refused_naming_its_field(server, case: tuple[pb.GenerateRequest, str]) -> None:  # type: ignore[no-untyped-def]
    request, field = case
    status, fields, responses = _outcome(server, request)
    assert (status, responses) == ("INVALID_ARGUMENT", []), (status, fields, field, request)
    assert field in fields, (fields, field, request)


def _parses(message_type, data: bytes) -> bool:  # type: ignore[no-untyped-def]
    try:
        message_type.FromString(data)
    except DecodeError:
        return False
    return True


def _text_field(payload: bytes) -> bytes:
    """A GenerateRequest whose input.text holds `payload` (field 2 > field 1, length-delimited)."""
    inner = b"\x0a" + bytes([len(payload)]) + payload
    return b"\x12" + bytes([len(inner)]) + inner


METHODS = {"Generate": pb.GenerateRequest, "Embed": pb.EmbedRequest, "Tokenize": pb.TokenizeRequest,
           "Detokenize": pb.DetokenizeRequest}
UNPARSABLE = st.one_of(st.binary(min_size=1, max_size=300),  # invalid UTF-8 in a string field, and anything
                       st.binary(min_size=1, max_size=100).map(_text_field))


@SETTINGS
@given(data=UNPARSABLE, method=st.sampled_from(sorted(METHODS)))
def test_bytes_that_do_not_parse_are_invalid_argument(server, data: bytes, method: str) -> None:  # type: ignore[no-untyped-def]
    assume(not _parses(METHODS[method], data))
    with grpc.insecure_channel(server.address) as channel:
        path = f"/llmserve.v1.LLMService/{method}"
        with pytest.raises(grpc.RpcError) as refused:
            if method in ("Generate", "Embed"):
                list(channel.stream_stream(path)(iter([data]), timeout=CALL_TIMEOUT))
            else:
                channel.unary_unary(path)(data, timeout=CALL_TIMEOUT)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (refused.value, data)


EMBED_INPUTS = st.one_of(TEXT.map(lambda t: pb.Input(text=t)),
                         st.lists(IN_VOCAB, min_size=1, max_size=64).map(lambda ids: pb.Input(tokens=pb.TokenIds(ids=ids))))


@SETTINGS
@given(inputs=st.lists(EMBED_INPUTS, min_size=1, max_size=20), truncate=st.booleans(),
       bad=st.one_of(st.none(), st.tuples(st.integers(0, 20), st.sampled_from(["text", "tokens", "outside"]))))
def test_embed_inputs(server, inputs: list[pb.Input], truncate: bool, bad: tuple[int, str] | None) -> None:  # type: ignore[no-untyped-def]
    """Valid inputs: one vector each, in order. One empty or out-of-vocabulary input: refused naming it."""
    field = None
    if bad is not None:
        at, kind = min(bad[0], len(inputs)), bad[1]
        inputs.insert(at, {"text": pb.Input(text=""), "tokens": pb.Input(tokens=pb.TokenIds()),
                           "outside": pb.Input(tokens=pb.TokenIds(ids=[2, N_VOCAB]))}[kind])
        field = f"inputs[{at}].text" if kind == "text" else f"inputs[{at}].tokens.ids"
    request = pb.EmbedRequest(options=pb.EmbedOptions(truncate=truncate), inputs=inputs)
    with grpc.insecure_channel(server.address) as channel:
        call = pb_grpc.LLMServiceStub(channel).Embed(iter([request]), timeout=CALL_TIMEOUT)
        if field is None:
            assert [r.index for r in call] == list(range(len(inputs)))
            return
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
    e = from_rpc_error(refused.value)
    assert (e.code(), e.field) == (grpc.StatusCode.INVALID_ARGUMENT, field), (e, inputs)


@SETTINGS
@given(ids=st.lists(IN_VOCAB, max_size=64), bad=st.one_of(st.none(), OUTSIDE_VOCAB), text=st.text(max_size=200))
def test_tokenizer_calls(server, ids: list[int], bad: int | None, text: str) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=CALL_TIMEOUT) as client:
        assert isinstance(client.tokenize(text), list)
        if bad is None:
            assert isinstance(client.detokenize(ids), str)
            return
        with pytest.raises(grpc.RpcError) as refused:
            client.detokenize([*ids, bad])
    e = from_rpc_error(refused.value)
    assert (e.code(), e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "ids"), e


def test_the_limits_above_are_the_servers(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=30) as client:
        info = client.model_info()
    assert (info.vocab_size, info.n_ctx_per_slot, min(info.n_parallel, 8)) == (N_VOCAB, N_CTX_PER_SLOT, MAX_SAMPLES)


def test_server_survived_the_fuzzing(server) -> None:  # type: ignore[no-untyped-def]
    assert server.process.poll() is None
    with Client(server.address, timeout=30) as client:
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2
    log = server.log_path.read_text()
    assert "rpc_internal_error" not in log

"""Property-based fuzzing of every request field (hypothesis): a bad value is
INVALID_ARGUMENT (or another deliberate status), never INTERNAL/UNKNOWN, never a crash."""

from __future__ import annotations

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmserve.client import Client, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

ACCEPTED = {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)
TOKENS = st.lists(st.one_of(st.integers(0, 262143), INT32), max_size=64)
TEXT = st.text(max_size=200)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _maybe(strategy):  # type: ignore[no-untyped-def]
    return st.one_of(st.none(), strategy)


@st.composite
def generate_requests(draw):  # type: ignore[no-untyped-def]
    sampling = pb.SamplingParams()
    for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
                 "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base",
                 "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent"):
        value = draw(_maybe(FLOATS))
        if value is not None:
            setattr(sampling, name, value)
    for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat"):
        value = draw(_maybe(INT32))
        if value is not None:
            setattr(sampling, name, value)
    for token, bias in draw(st.dictionaries(INT32, FLOATS, max_size=4)).items():
        sampling.logit_bias[token] = bias
    stopping = pb.StoppingCriteria(
        stop=draw(st.lists(TEXT, max_size=20)),
        stop_token_ids=draw(st.lists(INT32, max_size=20)),
        ignore_eos=draw(st.booleans()),
    )
    stopping.max_tokens = draw(st.one_of(st.integers(-5, 40), INT32))
    config = pb.SessionConfig(
        request_id=draw(st.text(max_size=200)),
        sampling=sampling,
        stopping=stopping,
        priority=draw(INT32),
        output=pb.OutputOptions(include_special=draw(st.booleans())),
    )
    top = draw(_maybe(st.integers(-3, 30)))
    if top is not None:
        config.output.top_logprobs = top
    n = draw(_maybe(st.integers(-2, 10)))
    if n is not None:
        config.n = n
    kind = draw(st.sampled_from(["text", "tokens", "grammar", "schema", "none"]))
    request = pb.GenerateRequest(config=config, end_of_turn=draw(st.booleans()), cancel=draw(st.booleans()))
    if kind == "text":
        request.input.text = draw(TEXT)
    elif kind == "tokens":
        request.input.tokens.ids.extend(draw(TOKENS))
    elif kind == "grammar":
        request.input.text = "hi"
        config.constraint.grammar = draw(TEXT)
    elif kind == "schema":
        request.input.text = "hi"
        config.constraint.json_schema = draw(TEXT)
    return request


def _status(call) -> str:  # type: ignore[no-untyped-def]
    try:
        list(call)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name  # type: ignore[no-any-return]


@SETTINGS
@given(request=generate_requests())
def test_fuzzed_generate_requests(server, request: pb.GenerateRequest) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        status = _status(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=3))
    assert status in ACCEPTED, (status, request)


@SETTINGS
@given(
    inputs=st.lists(st.one_of(TEXT.map(lambda t: pb.Input(text=t)), TOKENS.map(lambda ids: pb.Input(tokens=pb.TokenIds(ids=ids)))), max_size=20),
    truncate=st.booleans(),
)
def test_fuzzed_embed_requests(server, inputs: list[pb.Input], truncate: bool) -> None:  # type: ignore[no-untyped-def]
    request = pb.EmbedRequest(options=pb.EmbedOptions(truncate=truncate), inputs=inputs)
    with grpc.insecure_channel(server.address) as channel:
        status = _status(pb_grpc.LLMServiceStub(channel).Embed(iter([request]), timeout=30))
    assert status in ACCEPTED


@SETTINGS
@given(data=st.binary(max_size=300), method=st.sampled_from(["Generate", "Embed", "Tokenize", "Detokenize"]))
def test_raw_bytes_including_invalid_utf8(server, data: bytes, method: str) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        if method in ("Generate", "Embed"):
            status = _status(channel.stream_stream(f"/llmserve.v1.LLMService/{method}")(iter([data]), timeout=3))
        else:
            try:
                channel.unary_unary(f"/llmserve.v1.LLMService/{method}")(data, timeout=3)
                status = "OK"
            except grpc.RpcError as err:
                status = err.code().name
    assert status in ACCEPTED, (status, data)


@SETTINGS
@given(ids=TOKENS, text=TEXT)
def test_fuzzed_tokenizer_calls(server, ids: list[int], text: str) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=10) as client:
        try:
            client.detokenize(ids)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert isinstance(client.tokenize(text), list)


def test_server_survived_the_fuzzing(server) -> None:  # type: ignore[no-untyped-def]
    assert server.process.poll() is None
    with Client(server.address, timeout=30) as client:
        assert client.generate("Hello", max_tokens=2).turn_end.usage.completion_tokens == 2
    assert "rpc_internal_error" not in server.log_path.read_text()

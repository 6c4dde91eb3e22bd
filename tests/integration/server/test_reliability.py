"""Issue 14's reproducers, each a named regression test against the real server: options
that are valid alone but crashed, hung or corrupted the server together."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.metrics import metric
from harness.server import RunningServer, rss_kb, start_server, stop_server
from tests.helpers import SessionStream, generate_turn
from tests.soak.server_state import kv_leaks, wait_until_idle

EOG_IDS = (1, 106, 212)


def _yes_grammar(**stopping: object) -> pb.SessionConfig:
    config = session_config(max_tokens=8, temperature=0, **stopping)  # type: ignore[arg-type]
    config.constraint.grammar = 'root ::= "yes"'
    return config


def _min_tokens() -> pb.SessionConfig:
    config = _yes_grammar()
    config.stopping.min_tokens = 5
    return config


def _eog_banned() -> pb.SessionConfig:
    config = _yes_grammar()
    for token in EOG_IDS:
        config.sampling.logit_bias[token] = float("-inf")
    return config


def _two_samples() -> pb.SessionConfig:
    config = _yes_grammar(ignore_eos=True)
    config.n = 2
    return config


@pytest.mark.parametrize(
    "make_config",
    [lambda: _yes_grammar(ignore_eos=True), _min_tokens, _eog_banned, _two_samples],
    ids=["ignore_eos", "min_tokens", "logit_bias_eog", "n2"],
)
def test_1_grammar_that_can_only_end_while_ending_is_forbidden(server: RunningServer, make_config) -> None:  # type: ignore[no-untyped-def]
    responses = generate_turn(server.address, make_config(), "Answer:")
    ends = [r.turn_end for r in responses if r.HasField("turn_end")]
    texts: dict[int, str] = {}
    for r in responses:
        if r.HasField("chunk"):
            texts[r.chunk.index] = texts.get(r.chunk.index, "") + r.chunk.text
    assert ends and all(e.finish_reason == pb.FINISH_REASON_STOP for e in ends)
    assert all("grammar is complete" in e.message for e in ends)
    assert set(texts.values()) == {"yes"}
    assert server.process.poll() is None


@pytest.mark.parametrize(
    "schema,where",
    [
        ({"type": "string", "pattern": "^a{1,1000000}$"}, "/pattern"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 100000000}, "/minItems"),
    ],
    ids=["2_pattern_1e6", "3_min_items_1e8"],
)
def test_2_3_schema_repetitions_are_refused_by_name(server: RunningServer, schema: dict, where: str) -> None:  # type: ignore[type-arg]
    config = session_config(max_tokens=4)
    config.constraint.json_schema = json.dumps(schema)
    with pytest.raises(grpc.RpcError) as err:
        generate_turn(server.address, config, "Answer:", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert where in err.value.details() and "1000" in err.value.details()
    assert generate_turn(server.address, session_config(max_tokens=2), "Hi", timeout=10)  # still serving


def test_2_deep_grammar_crashes_only_the_grammar_worker(server: RunningServer) -> None:
    """A GBNF that overflows llama.cpp's recursive parser: SIGSEGV in the worker, INVALID_ARGUMENT here."""
    config = session_config(max_tokens=4)
    config.constraint.grammar = "root ::= " + "(" * 20000 + '"a"' + ")" * 20000
    with pytest.raises(grpc.RpcError) as err:
        generate_turn(server.address, config, "Answer:", timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grammar" in err.value.details()
    assert generate_turn(server.address, session_config(max_tokens=2), "Hi", timeout=10)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["-np", "2", "-c", "512", "-t", "2", "--max-queue", "1", "--first-message-timeout", "2"]
    running = start_server(args, tmp_path_factory.mktemp("small") / "server.log", metrics=True)
    yield running
    assert stop_server(running) == 0


def test_4_streams_without_a_first_message_do_not_take_admission(small_server: RunningServer) -> None:
    with grpc.insecure_channel(small_server.address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        gate = threading.Event()

        def silent() -> Iterator[pb.GenerateRequest]:
            gate.wait()
            return
            yield  # pragma: no cover

        idle = [stub.Generate(silent(), timeout=30) for _ in range(8)]
        time.sleep(0.3)
        assert generate_turn(small_server.address, session_config(max_tokens=2), "Hi", timeout=10)
        codes = []
        for call in idle:
            with pytest.raises(grpc.RpcError) as err:
                list(call)
            codes.append(err.value.code())
        gate.set()
    assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert metric(small_server.metrics_port, "llmserve_sessions") == 0


def test_5_empty_turns_after_context_full_never_grow_the_slot(small_server: RunningServer) -> None:
    with grpc.insecure_channel(small_server.address) as channel:
        s = SessionStream(channel, timeout=60, temperature=0, ignore_eos=True)
        s.send("Count to a thousand:")
        reasons = [s.read_turn()[2].finish_reason]
        for _ in range(6):
            s.send(None, end_of_turn=True)
            reasons.append(s.read_turn()[2].finish_reason)
        s.close()
        list(s.call)
    assert set(reasons) == {pb.FINISH_REASON_CONTEXT_FULL}
    info = wait_until_idle(small_server.address)
    assert all(slot.num_cached_tokens <= 256 for slot in info.slots)
    assert kv_leaks(info) == []


def test_6_a_second_queued_turn_is_refused(server: RunningServer) -> None:
    requests = [pb.GenerateRequest(config=session_config(max_tokens=4), input=make_input("Count:"), end_of_turn=True)]
    requests += [pb.GenerateRequest(end_of_turn=True) for _ in range(1000)]
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.LLMServiceStub(channel).Generate(iter(requests), timeout=30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "queued" in err.value.details()


def test_7_prompt_logprobs_keep_memory_bounded(server: RunningServer) -> None:
    before = rss_kb(server.process.pid)
    config = session_config(max_tokens=2)
    config.output.prompt_logprobs = True
    text = " ".join(f"w{i % 50}" for i in range(650))  # about 1,300 tokens
    responses = generate_turn(server.address, config, text, timeout=300)
    scored = sum(len(r.prompt_logprobs.tokens) for r in responses if r.HasField("prompt_logprobs"))
    grown_mib = (rss_kb(server.process.pid) - before) / 1024
    print(f"{scored} prompt tokens scored; RSS grew {grown_mib:.0f} MiB")
    assert scored > 1000 and grown_mib < 256


def test_8_large_tokenize_leaves_the_event_loop_free(server: RunningServer) -> None:
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        future = stub.Tokenize.future(pb.TokenizeRequest(text="hello world " * 400_000), timeout=120)
        time.sleep(0.2)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
        answered_first = not future.done()
        assert len(future.result().ids) > 800_000
    assert info.name and answered_first

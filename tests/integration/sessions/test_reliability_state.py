"""Issue 14's reproducers about lost state and dishonest sampling (9-11), as named
regression tests against a real server with --session-dir and a chat template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import CHAT_SERVER_ARGS, RunningServer, start_server, stop_server
from tests.helpers import SessionStream


@pytest.fixture(scope="module")
def state_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    sessions = tmp_path_factory.mktemp("sessions")
    args = [*CHAT_SERVER_ARGS, "--session-dir", str(sessions)]
    running = start_server(args, tmp_path_factory.mktemp("state") / "server.log")
    yield running
    assert stop_server(running) == 0


def _one_turn(address: str, config: pb.SessionConfig, text: str) -> tuple[str, pb.TurnEnd]:
    with grpc.insecure_channel(address) as channel:
        request = pb.GenerateRequest(config=config, input=make_input(text), end_of_turn=True)
        responses = list(pb_grpc.LLMServiceStub(channel).Generate(iter([request]), timeout=60))
    text_out = "".join(r.chunk.text for r in responses if r.HasField("chunk"))
    return text_out, responses[-1].turn_end


def test_9_named_session_reopened_at_once_keeps_its_history(state_server: RunningServer) -> None:
    cached = []
    for i in range(5):
        config = session_config(max_tokens=6, temperature=0)
        config.session_id = "reopen-at-once"
        _, end = _one_turn(state_server.address, config, f"Part {i}: go on.")
        cached.append(end.usage.cached_tokens)
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:])), cached


def test_10_chat_messages_sent_mid_reply_wait_for_it(state_server: RunningServer) -> None:
    def user(text: str) -> pb.Input:
        return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=text)]))

    with grpc.insecure_channel(state_server.address) as channel:
        s = SessionStream(channel, timeout=60, max_tokens=24, temperature=0)
        s.send(user("Tell me a story about a cat."))
        s.next_response()  # the reply has started
        s.send(user("Make it shorter."))  # before it ends
        first = s.read_turn()[2]
        second = s.read_turn()[2]
        s.close()
        list(s.call)
    assert first.finish_reason == pb.FINISH_REASON_LENGTH
    assert second.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert second.usage.cached_tokens > first.usage.prompt_tokens  # the first reply is in the history


def test_11_seed_that_means_random_is_refused(state_server: RunningServer) -> None:
    config = session_config(max_tokens=2)
    config.sampling.seed = 0xFFFFFFFF
    with pytest.raises(grpc.RpcError) as err:
        _one_turn(state_server.address, config, "Hi")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "seed" in err.value.details()


def test_11_grammar_errors_carry_the_parser_reason(state_server: RunningServer) -> None:
    config = session_config(max_tokens=2)
    config.constraint.grammar = 'root ::= root "a" | "a"'
    with pytest.raises(grpc.RpcError) as err:
        _one_turn(state_server.address, config, "Hi")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "left recursion" in err.value.details()


def test_11_dry_applies_at_temperature_zero(state_server: RunningServer) -> None:
    prompt = "the cat the cat the cat the cat the cat the cat the cat"
    plain, _ = _one_turn(state_server.address, session_config(max_tokens=12, temperature=0), prompt)
    config = session_config(max_tokens=12, temperature=0)
    config.sampling.dry_multiplier = 3.0
    dry, _ = _one_turn(state_server.address, config, prompt)
    assert "the cat" in plain and dry != plain


def test_11_penalties_see_a_cached_prompt(state_server: RunningServer) -> None:
    prompt = "List words: apple, apple, apple, apple, apple, apple, apple,"
    config = session_config(max_tokens=10, temperature=0)
    config.sampling.repeat_penalty = 1.8
    miss, first = _one_turn(state_server.address, config, prompt)
    hit, second = _one_turn(state_server.address, config, prompt)
    assert second.usage.cached_tokens > 0 and first.usage.cached_tokens < second.usage.cached_tokens
    assert hit == miss


def test_restore_checks_the_file_against_the_running_configuration(tmp_path: Path) -> None:
    """A session saved by a server with 2,048-token slots is not loaded into 256-token slots."""
    sessions = tmp_path / "sessions"
    big = start_server(["-np", "1", "-c", "2048", "-t", "2", "--session-dir", str(sessions)], tmp_path / "big.log")
    config = session_config(max_tokens=4, temperature=0)
    config.session_id = "too-big-later"
    try:
        _, end = _one_turn(big.address, config, " ".join(["word"] * 400))
        assert end.usage.prompt_tokens > 300
    finally:
        assert stop_server(big) == 0
    small = start_server(["-np", "2", "-c", "512", "-t", "2", "--session-dir", str(sessions)], tmp_path / "small.log")
    try:
        _, end = _one_turn(small.address, config, "Again.")
    finally:
        assert stop_server(small) == 0
    assert end.usage.cached_tokens == 0
    log = (tmp_path / "small.log").read_text()
    assert "session_discarded" in log and "do not fit a slot of 256" in log


def _chat(*pairs: tuple[str, str]) -> pb.Input:
    return pb.Input(messages=pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in pairs]))


def test_a_chat_session_the_server_ended_goes_on_with_messages(state_server: RunningServer) -> None:
    """The call's deadline expires mid-reply, so the executor ends the session, not the
    stream's close: it is saved with the conversation the stream had, and the next stream
    on the id goes on with messages (found by the combination fuzzer, seed 5)."""
    with grpc.insecure_channel(state_server.address) as channel:
        s = SessionStream(channel, timeout=2.0, session_id="chat-deadline", max_tokens=8, temperature=0)
        s.send(_chat(("user", "Name a colour.")))
        _, _, first = s.read_turn()
        s.send(_chat(("user", "Now write a very long story about it.")))
        with pytest.raises(grpc.RpcError) as err:
            for _ in range(10_000):  # max_tokens 8 ends the turn: ask again until the deadline
                s.read_turn()
                s.send(_chat(("user", "Go on, longer.")))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        again = SessionStream(channel, timeout=60, session_id="chat-deadline", max_tokens=4, temperature=0)
        again.send(_chat(("user", "Thanks.")))
        _, _, end = again.read_turn()
        again.close()
        assert list(again.call) == []
    print(f'after the deadline: cached {end.usage.cached_tokens} of {end.usage.prompt_tokens}')
    assert first.usage.prompt_tokens > 0
    assert end.usage.cached_tokens >= first.usage.prompt_tokens  # the conversation's KV was kept

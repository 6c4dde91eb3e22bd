"""Incremental prefill and the slot's context limit."""

from __future__ import annotations

import time

import grpc
from llmserve.client import Client, pb

from tests.greedy import parting
from tests.helpers import SessionStream


def test_prompt_streamed_in_pieces_gives_the_same_output(server, fresh_server) -> None:  # type: ignore[no-untyped-def]
    """The one-shot run is on another server: on the same one the streamed pieces would all
    come from its prefix cache (measured: 21 of 21 tokens cached), and the incremental
    prefill would go untested. Prefilled in three pieces rather than one batch, the same
    tokens' logprobs moved by up to 0.149 nats here (AVX2), so the replies are compared by
    their logprobs (tests/greedy.py), not as token lists, within twice that."""
    prompt = "Streaming a prompt while it is being written: the server prefills each piece as it arrives, so"
    kw = dict(max_tokens=16, temperature=0, ignore_eos=True, top_logprobs=4)
    with Client(fresh_server.address, timeout=60) as client:
        ids = client.tokenize(prompt)
        one_shot = client.generate(ids, **kw)
    with grpc.insecure_channel(server.address) as channel:
        session = SessionStream(channel, **kw)
        thirds = [ids[: len(ids) // 3], ids[len(ids) // 3 : 2 * len(ids) // 3], ids[2 * len(ids) // 3 :]]
        for piece in thirds:
            session.send(piece, end_of_turn=False)
            time.sleep(0.2)  # each piece is prefilled before the next arrives
        session.send(None, end_of_turn=True)
        _, streamed_ids, end = session.read_turn()
        session.close()
    assert end.usage.prompt_tokens == len(ids) and end.usage.cached_tokens == 0
    assert len(session.turn_logprobs) == len(streamed_ids) == len(one_shot.logprobs) == 16
    print(f"streamed vs one-shot prompt: parted at {parting(one_shot.logprobs, session.turn_logprobs, 0.3)}")
    # Only the held-back last token was left to compute after the end of input.
    print(f"TTFT after end of input: {end.timings.time_to_first_token_ms:.1f} ms (one-shot prompt_ms "
          f"{one_shot.turn_end.timings.prompt_ms:.1f})")
    assert end.timings.time_to_first_token_ms < one_shot.turn_end.timings.time_to_first_token_ms * 3 + 50


def test_generation_stops_with_context_full(server) -> None:  # type: ignore[no-untyped-def]
    with Client(server.address, timeout=120) as client:
        per_slot = client.model_info().n_ctx_per_slot
        prompt = [2] + [1000 + (i % 500) for i in range(per_slot - 20)]
        result = client.generate(prompt, temperature=0, ignore_eos=True)
    assert result.turn_end.finish_reason == pb.FINISH_REASON_CONTEXT_FULL
    assert result.turn_end.usage.prompt_tokens + result.turn_end.usage.completion_tokens == per_slot + 1


def test_input_sent_during_a_turn_waits_for_the_next_turn(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        session = SessionStream(channel, max_tokens=8, temperature=0, ignore_eos=True)
        session.send("First question: what is two plus two?")
        session.send(" Second question: and three plus three?")  # pipelined before turn 1 ends
        _, ids1, end1 = session.read_turn()
        _, ids2, end2 = session.read_turn()
        session.close()
        assert list(session.call) == []
    assert end1.usage.completion_tokens == len(ids1) == 8
    assert end2.usage.completion_tokens == len(ids2) == 8
    assert end2.usage.cached_tokens == end1.usage.prompt_tokens + 8 - 1


def test_half_close_without_end_of_turn_runs_the_input(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel:
        session = SessionStream(channel, max_tokens=4, temperature=0)
        session.send("Hello there", end_of_turn=False)
        session.close()
        _, ids, end = session.read_turn()
    assert end.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert 1 <= len(ids) <= 4

"""Multi-turn sessions: the KV stays on the slot; only new input is prefilled."""

from __future__ import annotations

import grpc
from llmserve.client import Client, pb

from tests.greedy import parting
from tests.helpers import SessionStream

TURN1 = "Question: What is the capital of Italy?\nAnswer:"
TURN2 = "\nQuestion: And the capital of Spain?\nAnswer:"


def test_second_turn_reuses_the_first_turns_kv(server, fresh_server) -> None:  # type: ignore[no-untyped-def]
    """Turn 2, computed on the KV turn 1 left, is what a cold server computes for the
    whole conversation as one prompt. The cold run is on another server: on this one the
    prompt would be served from turn 2's own KV and saved logits (the same digits, even if
    that KV were wrong). Compared by logprobs (tests/greedy.py): the cold prefill runs the
    conversation in one batch, the session in two, so the digits differ (measured here,
    AVX2: by up to 0.051 nats over the 12 tokens)."""
    greedy = dict(max_tokens=12, temperature=0, ignore_eos=True, top_logprobs=4)
    with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=60) as client:
        turn1_ids = client.tokenize(TURN1, add_special=True)
        turn2_ids = client.tokenize(TURN2, add_special=False)
        session = SessionStream(channel, **greedy)  # type: ignore[arg-type]
        session.send(TURN1)
        _, gen1, end1 = session.read_turn()
        assert end1.usage.prompt_tokens == len(turn1_ids)
        assert end1.usage.completion_tokens == len(gen1) == 12
        session.send(turn2_ids)
        _, gen2, end2 = session.read_turn()
        turn2 = session.turn_logprobs
        session.close()
        # Every token of turn 1 that entered the KV is cached: the prompt and all
        # generated tokens but the last, which is decoded with turn 2's input.
        assert end2.usage.cached_tokens == len(turn1_ids) + len(gen1) - 1
        assert end2.usage.prompt_tokens == len(turn2_ids)

    with Client(fresh_server.address, timeout=60) as cold_client:
        cold = cold_client.generate(turn1_ids + gen1 + turn2_ids, **greedy)  # type: ignore[arg-type]
    assert cold.turn_end.usage.cached_tokens == 0
    assert len(turn2) == len(gen2) == len(cold.logprobs) == 12
    print(f"turn 2 vs the conversation on a cold server: parted at {parting(cold.logprobs, turn2)}")


def test_prefix_cache_across_sessions(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "A long shared system prompt about llamas and gRPC services.\n" * 8
    with Client(server.address, timeout=60) as client:
        num_prompt = len(client.tokenize(prompt))
        client.generate(prompt + "First:", max_tokens=4, temperature=0)
        second = client.generate(prompt + "Second:", max_tokens=4, temperature=0)
    assert second.turn_end.usage.cached_tokens >= num_prompt - 1
    assert second.turn_end.finish_reason == pb.FINISH_REASON_LENGTH

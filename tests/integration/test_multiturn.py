"""Multi-turn sessions: the KV stays on the slot; only new input is prefilled."""

from __future__ import annotations

import grpc
from llmserve.client import Client, pb

from tests.helpers import SessionStream

TURN1 = "Question: What is the capital of Italy?\nAnswer:"
TURN2 = "\nQuestion: And the capital of Spain?\nAnswer:"


def test_second_turn_reuses_the_first_turns_kv(server) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(server.address) as channel, Client(server.address, timeout=60) as client:
        turn1_ids = client.tokenize(TURN1, add_special=True)
        turn2_ids = client.tokenize(TURN2, add_special=False)
        session = SessionStream(channel, max_tokens=12, temperature=0, ignore_eos=True)
        session.send(TURN1)
        _, gen1, end1 = session.read_turn()
        assert end1.usage.prompt_tokens == len(turn1_ids)
        assert end1.usage.completion_tokens == len(gen1) == 12
        session.send(turn2_ids)
        _, gen2, end2 = session.read_turn()
        session.close()
        # Every token of turn 1 that entered the KV is cached: the prompt and all
        # generated tokens but the last, which is decoded with turn 2's input.
        assert end2.usage.cached_tokens == len(turn1_ids) + len(gen1) - 1
        assert end2.usage.prompt_tokens == len(turn2_ids)

        fresh = client.generate(turn1_ids + gen1 + turn2_ids, max_tokens=12, temperature=0, ignore_eos=True)
    common = 0
    while common < len(gen2) and common < len(fresh.token_ids) and gen2[common] == fresh.token_ids[common]:
        common += 1
    print(f"multi-turn vs fresh session: common prefix {common} of {len(gen2)} tokens")
    assert common >= 4


def test_prefix_cache_across_sessions(server) -> None:  # type: ignore[no-untyped-def]
    prompt = "A long shared system prompt about llamas and gRPC services.\n" * 8
    with Client(server.address, timeout=60) as client:
        num_prompt = len(client.tokenize(prompt))
        client.generate(prompt + "First:", max_tokens=4, temperature=0)
        second = client.generate(prompt + "Second:", max_tokens=4, temperature=0)
    assert second.turn_end.usage.cached_tokens >= num_prompt - 1
    assert second.turn_end.finish_reason == pb.FINISH_REASON_LENGTH

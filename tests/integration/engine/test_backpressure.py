"""Backpressure: a client that stops reading pauses only its own sequence."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.server import rss_kb

NORMAL = dict(max_tokens=64, temperature=0, ignore_eos=True)
PROMPTS = ["Tell me about rivers.", "Tell me about mountains.", "Tell me about deserts.", "Tell me about forests."]


def _four_streams(address: str) -> list[float]:
    with Client(address, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: client.generate(p, **NORMAL), PROMPTS))
    assert all(r.turn_end.usage.completion_tokens == 64 for r in results)
    return [r.turn_end.timings.decode_tokens_per_second for r in results]


def test_a_client_that_never_reads_pauses_only_itself(server) -> None:  # type: ignore[no-untyped-def]
    baseline = _four_streams(server.address)
    # A tiny HTTP/2 window: the server's writes block after ~1 KiB unread.
    stuck_channel = grpc.insecure_channel(
        server.address, options=[("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]
    )
    request = pb.GenerateRequest(
        config=session_config(max_tokens=2000, temperature=0, ignore_eos=True),
        input=make_input("Write an endless list of numbers:"),
        end_of_turn=True,
    )
    stuck = pb_grpc.LLMServiceStub(stuck_channel).Generate(iter([request]), timeout=300)  # never read
    try:
        with Client(server.address, timeout=10) as client:
            deadline = time.monotonic() + 30
            while not any(s.paused for s in client.model_info().slots):
                assert time.monotonic() < deadline, "the unread stream was never paused"
                time.sleep(0.05)
            cached_when_paused = max(s.num_cached_tokens for s in client.model_info().slots if s.paused)
            # Warm-up beside the paused stream: llama.cpp's logits buffer grows once to the most
            # rows a step has asked for (speculation's draft rows too), and stays.
            _four_streams(server.address)
            rss_before = rss_kb(server.process.pid)
            during = _four_streams(server.address)
            rss_after = rss_kb(server.process.pid)
            paused = [s for s in client.model_info().slots if s.paused]
            assert paused, "the unread stream resumed without being read"
            assert max(s.num_cached_tokens for s in paused) == cached_when_paused  # it did not advance
    finally:
        stuck.cancel()
        stuck_channel.close()
    ratio = sum(during) / sum(baseline)
    print(
        f"per-stream decode tok/s without {sum(baseline) / 4:.1f}, with a stuck client {sum(during) / 4:.1f} "
        f"(ratio {ratio:.2f}); stuck session paused at {cached_when_paused} tokens; "
        f"server RSS {rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB"
    )
    assert ratio > 0.7
    assert rss_after - rss_before < 20 * 1024

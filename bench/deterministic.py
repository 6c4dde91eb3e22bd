"""What deterministic mode costs: the same greedy load in and out of it, on one llmserve.

    python -m bench.deterministic [--streams 1 16] [--tokens 64] [--rounds 3]

One server (the bench's -np/-c/-t). Per round and stream count, the two modes alternate:
`streams` concurrent GenerateText calls, each a distinct prompt with a shared head (the
production shape), `--tokens` tokens with ignore_eos, greedy, logprobs on. Reports the
aggregate tokens/s (completion tokens over the load's wall time), medians over rounds, and
how many deterministic replies differ (tokens or logprobs, bit for bit) from the same
prompt's reply alone: 0 is the mode's promise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from .servers import NP, start_llmserve, stop

HEAD = "You are a helpful assistant for a travel company. Answer the customer's question in full. "
Reply = tuple[tuple[int, ...], tuple[float, ...]]


def _prompt(i: int) -> str:
    return HEAD * 2 + f"Customer {i}: what should I pack for {3 + i % 9} days in city number {i}?"


def _call(stub: pb_grpc.LLMServiceStub, i: int, tokens: int, deterministic: bool) -> Reply:
    config = session_config(max_tokens=tokens, temperature=0, ignore_eos=True, logprobs=True,
                            deterministic=deterministic)
    sample = stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text=_prompt(i))),
                               timeout=600).samples[0]
    return tuple(sample.token_ids), tuple(t.logprob for t in sample.logprobs)


def _load(stub: pb_grpc.LLMServiceStub, streams: int, tokens: int, deterministic: bool) -> tuple[float, list[Reply]]:
    start = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        replies = list(pool.map(lambda i: _call(stub, i, tokens, deterministic), range(streams)))
    return streams * tokens / (time.monotonic() - start), replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assert max(args.streams) <= NP, f"at most {NP} streams (the bench's slots)"
    process, address = start_llmserve(Path("/tmp/bench-deterministic.log"), embed_args=())
    try:
        stub = pb_grpc.LLMServiceStub(grpc.insecure_channel(address))
        alone = [_call(stub, i, args.tokens, True) for i in range(max(args.streams))]
        rates: dict[tuple[int, bool], list[float]] = {}
        differing = 0
        for _ in range(args.rounds):
            for streams in args.streams:
                for deterministic in (False, True):
                    rate, replies = _load(stub, streams, args.tokens, deterministic)
                    rates.setdefault((streams, deterministic), []).append(rate)
                    if deterministic:
                        differing += sum(reply != alone[i] for i, reply in enumerate(replies))
        print(f"| streams | plain tokens/s | deterministic tokens/s | cost |  ({args.rounds} rounds, medians)")
        for streams in args.streams:
            plain, det = (statistics.median(rates[(streams, mode)]) for mode in (False, True))
            print(f"| {streams} | {plain:.1f} | {det:.1f} | {det / plain:.2f}x |")
        print(f"deterministic replies differing from the same prompt alone: {differing}")
    finally:
        stop(process)


if __name__ == "__main__":
    main()

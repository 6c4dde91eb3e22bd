"""Load generator for llmserve's Generate RPC (asyncio + grpc.aio).

    python -m bench.loadgen --address 127.0.0.1:50051 --concurrency 1,4,8,16

Each level runs `concurrency` workers that each send `--rounds` one-turn
requests (fixed prompt set, `--max-tokens` new tokens with ignore_eos, greedy),
and reports aggregate generated tokens/s, TTFT and inter-token latency.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import grpc
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the ocean:",
    "def merge_sort(items):",
    "The three laws of thermodynamics are",
    "Once upon a time in a distant galaxy,",
    "A recipe for banana bread:",
    "The main causes of the French Revolution were",
    "In machine learning, overfitting means",
]


@dataclass
class LevelResult:
    concurrency: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _one(stub: pb_grpc.LLMServiceStub, prompt: str, max_tokens: int, result: LevelResult) -> None:
    request = pb.GenerateRequest(
        config=session_config(max_tokens=max_tokens, ignore_eos=True, temperature=0, seed=1),
        input=make_input(prompt),
        end_of_turn=True,
    )
    start = time.perf_counter()
    last = None
    try:
        async for response in stub.Generate(iter([request]), timeout=300):
            now = time.perf_counter()
            if response.HasField("chunk"):
                if last is None:
                    result.ttft_ms.append((now - start) * 1000)
                else:
                    result.itl_ms.append((now - last) * 1000)
                last = now
            else:
                result.tokens += response.turn_end.usage.completion_tokens
    except grpc.aio.AioRpcError:
        result.errors += 1


async def run_level(address: str, concurrency: int, rounds: int, max_tokens: int) -> LevelResult:
    result = LevelResult(concurrency)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        await _one(stub, PROMPTS[0], 4, LevelResult(0))  # warm-up

        async def worker(w: int) -> None:
            for r in range(rounds):
                await _one(stub, PROMPTS[(w + r) % len(PROMPTS)], max_tokens, result)

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print("| streams | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for level in (int(c) for c in args.concurrency.split(",")):
        r = asyncio.run(run_level(args.address, level, args.rounds, args.max_tokens))
        print(
            f"| {level} | {r.tokens_per_s:.1f} | {statistics.median(r.ttft_ms):.0f} | {_pct(r.ttft_ms, 0.99):.0f} "
            f"| {statistics.median(r.itl_ms):.1f} | {_pct(r.itl_ms, 0.99):.1f} | {r.errors} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

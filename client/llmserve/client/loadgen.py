"""Load generator: llmserve's Generate and Embed RPCs, and llama-server's HTTP API
driven with the same prompts, seeds and schedule (asyncio).

    llmserve bench --address 127.0.0.1:50051 [--peer-llama-server http://127.0.0.1:8080]
                            [--concurrency 1,4,8,16] [--rounds 3] [--max-tokens 64] [--embed]
                            [--workload rounds|pool]

Each concurrency level runs that many callers, `max_tokens` new tokens a request with
ignore_eos, under one of two workloads (`WORKLOADS`):
- `rounds` (bench.run's): each caller sends `rounds` one-turn requests back to back, greedy,
  fixed seed; every prompt starts with its own `Request L.c.r.` head.
- `pool`: the callers take the next of `rounds` x concurrency requests as each finishes;
  prompts are one of 8 sentences with a distinct suffix (`<sentence> (#i)`: many requests
  share a head and differ at the end, as one system prompt with many questions does);
  temperature 0.8, top_k 40.
Reported per level: aggregate generated tokens/s, TTFT p50/p99, inter-token latency
p50/p99, errors. Embed: a fixed corpus of ~25-token texts, texts/s and tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import grpc
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from . import make_input, pb, session_config
from .workloads import (  # noqa: F401 - PROMPTS, CORPUS, PromptFn, _prompt: bench's names for them
    CORPUS,
    POOL,
    PROMPTS,
    ROUNDS,
    WORKLOADS,
    LevelResult,
    PromptFn,
    Workload,
    _prompt,
    _run_callers,
    _Timer,
)

# ------------------------------------------------------------------ llmserve


async def _llmserve_one(stub: pb_grpc.LLMServiceStub, prompt: str, max_tokens: int, result: LevelResult,
                        workload: Workload = ROUNDS) -> None:
    request = pb.GenerateRequest(
        config=session_config(max_tokens=max_tokens, ignore_eos=True, temperature=workload.temperature,
                              top_k=workload.top_k, seed=1),
        input=make_input(prompt),
        end_of_turn=True,
    )
    timer = _Timer(result)
    try:
        async for response in stub.Generate(iter([request]), timeout=600):
            if response.HasField("chunk"):
                for _ in response.chunk.token_ids:
                    timer.token()
            else:
                result.tokens += response.turn_end.usage.completion_tokens
    except grpc.aio.AioRpcError:
        result.errors += 1


async def llmserve_level(
    address: str, concurrency: int, rounds: int, max_tokens: int, prompt: PromptFn | None = None,
    workload: Workload = ROUNDS,
) -> LevelResult:
    """One level of `workload` (`prompt`, when given, picks the prompts instead)."""
    workload = workload.with_prompt(prompt)
    result = LevelResult(concurrency)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        await _llmserve_one(stub, PROMPTS[0], 4, LevelResult(0))  # warm-up

        async def send(caller: int, request: int) -> None:
            await _llmserve_one(stub, workload.prompt(concurrency, caller, request), max_tokens, result, workload)

        result.wall_s = await _run_callers(concurrency, rounds, workload.pool, send)
    return result


async def llmserve_embed(address: str, texts: list[str], batch: int = 32) -> tuple[float, float]:
    """(texts/s, tokens/s) for one Embed stream of the corpus."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        async def requests(items: list[str]):  # type: ignore[no-untyped-def]
            for i in range(0, len(items), batch):
                yield pb.EmbedRequest(inputs=[pb.Input(text=t) for t in items[i : i + batch]])

        async for _ in stub.Embed(requests(texts[:8]), timeout=600):  # warm-up, read to the end
            pass
        start = time.perf_counter()
        tokens = 0
        async for response in stub.Embed(requests(texts), timeout=600):
            tokens += response.num_tokens
        elapsed = time.perf_counter() - start
    return len(texts) / elapsed, tokens / elapsed


# ------------------------------------------------------------------ llama-server


def peer_session(limit: int = 64):  # type: ignore[no-untyped-def]
    """An aiohttp session for llama-server: a new connection per request. llama-server
    closes a connection after a streamed reply, and a request that reused it failed at
    once ("Can not write request body", "Server disconnected"): every other request of a
    worker, which made its load lighter than the one it was compared with."""
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                 connector=aiohttp.TCPConnector(limit=limit, force_close=True))


async def _peer_one(session, url: str, prompt: str, max_tokens: int, result: LevelResult,  # type: ignore[no-untyped-def]
                    workload: Workload = ROUNDS) -> None:
    body = {
        "prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": workload.temperature,
        "top_k": workload.top_k, "seed": 1, "stream": True, "cache_prompt": True,
    }
    timer = _Timer(result)
    try:
        async with session.post(f"{url}/completion", json=body) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("stop"):
                    result.tokens += int(event.get("tokens_predicted") or event.get("timings", {}).get("predicted_n", 0))
                    break
                timer.token()
    except Exception:  # noqa: BLE001 - counted as an error, like a failed RPC
        result.errors += 1


async def peer_level(
    url: str, concurrency: int, rounds: int, max_tokens: int, prompt: PromptFn | None = None,
    workload: Workload = ROUNDS,
) -> LevelResult:
    """`llmserve_level` against llama-server's `/completion`."""
    workload = workload.with_prompt(prompt)
    result = LevelResult(concurrency)
    async with peer_session() as session:
        await _peer_one(session, url, PROMPTS[0], 4, LevelResult(0))

        async def send(caller: int, request: int) -> None:
            await _peer_one(session, url, workload.prompt(concurrency, caller, request), max_tokens, result, workload)

        result.wall_s = await _run_callers(concurrency, rounds, workload.pool, send)
    return result


async def peer_embed(url: str, texts: list[str], batch: int = 32, concurrency: int = 4) -> tuple[float, float]:
    """llama-server /embedding with `batch` texts per request, `concurrency` requests in flight."""
    async with peer_session() as session:
        async with session.post(f"{url}/tokenize", json={"content": texts[0]}) as r:
            per_text = len((await r.json())["tokens"]) + 1
        chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        for chunk in chunks:
            queue.put_nowait(chunk)

        async def worker() -> None:
            while not queue.empty():
                chunk = queue.get_nowait()
                async with session.post(f"{url}/embedding", json={"content": chunk}) as r:
                    r.raise_for_status()
                    await r.read()

        async with session.post(f"{url}/embedding", json={"content": texts[:8]}) as r:  # warm-up
            r.raise_for_status()
            await r.read()
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return len(texts) / elapsed, len(texts) * per_text / elapsed


# ------------------------------------------------------------------ CLI


def _row(name: str, level: int, s: dict[str, float]) -> str:
    return (
        f"| {name} | {level} | {s['tokens_per_s']:.1f} | {s['ttft_p50_ms']:.0f} | {s['ttft_p99_ms']:.0f} "
        f"| {s['itl_p50_ms']:.1f} | {s['itl_p99_ms']:.1f} | {s['errors']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default=os.environ.get("LLMSERVE_ADDRESS", "127.0.0.1:50051"))
    parser.add_argument("--peer-llama-server", default=None, help="llama-server base URL to drive the same way")
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--embed", action="store_true", help="also measure Embed throughput")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=ROUNDS.name)
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    print("| server | streams | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for level in (int(c) for c in args.concurrency.split(",")):
        r = asyncio.run(llmserve_level(args.address, level, args.rounds, args.max_tokens, workload=workload))
        print(_row("llmserve", level, r.summary()), flush=True)
        if args.peer_llama_server:
            p = asyncio.run(peer_level(args.peer_llama_server, level, args.rounds, args.max_tokens, workload=workload))
            print(_row("llama-server", level, p.summary()), flush=True)
    if args.embed:
        texts, tokens = asyncio.run(llmserve_embed(args.address, CORPUS))
        print(f"llmserve Embed: {texts:.1f} texts/s, {tokens:.0f} tokens/s")
        if args.peer_llama_server:
            texts, tokens = asyncio.run(peer_embed(args.peer_llama_server, CORPUS))
            print(f"llama-server /embedding: {texts:.1f} texts/s, {tokens:.0f} tokens/s")


if __name__ == "__main__":
    main()

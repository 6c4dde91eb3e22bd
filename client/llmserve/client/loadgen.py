"""Load generator: llmserve's Generate and Embed RPCs, and llama-server's HTTP API
driven with the same prompts, seeds and schedule (asyncio).

    llmserve bench --address 127.0.0.1:50051 [--peer-llama-server http://127.0.0.1:8080]
                            [--concurrency 1,4,8,16] [--rounds 3] [--max-tokens 64] [--embed]

Each concurrency level runs that many workers; each worker sends `rounds` one-turn
requests (greedy, fixed seed, `max_tokens` new tokens with ignore_eos) back to back.
Reported per level: aggregate generated tokens/s, TTFT p50/p99, inter-token latency
p50/p99, errors. Embed: a fixed corpus of ~25-token texts, texts/s and tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from . import make_input, pb, session_config

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
CORPUS = [
    f"Document {i}: the {w} quarterly report describes revenue, costs, hiring plans and the outlook for next year."
    for i, w in enumerate(["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"] * 32)
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

    def checked(self) -> LevelResult:
        """This result, or RuntimeError when calls failed: a rate over the calls that were
        left measures a lighter load than the one it is compared with."""
        if self.errors:
            raise RuntimeError(f"{self.errors} calls failed at concurrency {self.concurrency}: no figure from this level")
        return self

    def summary(self) -> dict[str, float]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "ttft_p50_ms": _pct(self.ttft_ms, 0.5),
            "ttft_p99_ms": _pct(self.ttft_ms, 0.99),
            "itl_p50_ms": _pct(self.itl_ms, 0.5),
            "itl_p99_ms": _pct(self.itl_ms, 0.99),
            "errors": float(self.errors),
        }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _prompt(level: int, worker: int, round_: int) -> str:
    """Every request differs at its end, so each one prefills for real on both servers
    (a repeated prompt would be served from a cache and flatter TTFT)."""
    return f"Request {level}.{worker}.{round_}. {PROMPTS[(worker + round_) % len(PROMPTS)]}"


class _Timer:
    """Collects TTFT and inter-token gaps for one request."""

    def __init__(self, result: LevelResult) -> None:
        self.result = result
        self.start = time.perf_counter()
        self.last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_ms.append((now - self.start) * 1000)
        else:
            self.result.itl_ms.append((now - self.last) * 1000)
        self.last = now


# ------------------------------------------------------------------ llmserve


async def _llmserve_one(stub: pb_grpc.LLMServiceStub, prompt: str, max_tokens: int, result: LevelResult) -> None:
    request = pb.GenerateRequest(
        config=session_config(max_tokens=max_tokens, ignore_eos=True, temperature=0, seed=1),
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


PromptFn = Callable[[int, int, int], str]  # (level, worker, round) -> prompt


async def llmserve_level(
    address: str, concurrency: int, rounds: int, max_tokens: int, prompt: PromptFn | None = None
) -> LevelResult:
    """`concurrency` workers send `rounds` one-turn requests each; `prompt` picks them."""
    prompt = prompt or _prompt
    result = LevelResult(concurrency)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        await _llmserve_one(stub, PROMPTS[0], 4, LevelResult(0))  # warm-up

        async def worker(w: int) -> None:
            for r in range(rounds):
                await _llmserve_one(stub, prompt(concurrency, w, r), max_tokens, result)

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        result.wall_s = time.perf_counter() - start
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


async def _peer_one(session, url: str, prompt: str, max_tokens: int, result: LevelResult) -> None:  # type: ignore[no-untyped-def]
    body = {
        "prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0, "seed": 1,
        "stream": True, "cache_prompt": True,
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
    url: str, concurrency: int, rounds: int, max_tokens: int, prompt: PromptFn | None = None
) -> LevelResult:
    prompt = prompt or _prompt
    result = LevelResult(concurrency)
    async with peer_session() as session:
        await _peer_one(session, url, PROMPTS[0], 4, LevelResult(0))

        async def worker(w: int) -> None:
            for r in range(rounds):
                await _peer_one(session, url, prompt(concurrency, w, r), max_tokens, result)

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        result.wall_s = time.perf_counter() - start
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
    args = parser.parse_args()
    print("| server | streams | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for level in (int(c) for c in args.concurrency.split(",")):
        r = asyncio.run(llmserve_level(args.address, level, args.rounds, args.max_tokens))
        print(_row("llmserve", level, r.summary()), flush=True)
        if args.peer_llama_server:
            p = asyncio.run(peer_level(args.peer_llama_server, level, args.rounds, args.max_tokens))
            print(_row("llama-server", level, p.summary()), flush=True)
    if args.embed:
        texts, tokens = asyncio.run(llmserve_embed(args.address, CORPUS))
        print(f"llmserve Embed: {texts:.1f} texts/s, {tokens:.0f} tokens/s")
        if args.peer_llama_server:
            texts, tokens = asyncio.run(peer_embed(args.peer_llama_server, CORPUS))
            print(f"llama-server /embedding: {texts:.1f} texts/s, {tokens:.0f} tokens/s")


if __name__ == "__main__":
    main()

"""aLoRA: the base's cached context reused by an aLoRA call (issue 43), llmserve vs llama-server.

    python -m bench.alora [--llama-server PATH] [--rounds 5] [--words 600]

Both servers serve the test aLoRA (tools/make_adapters.py's `strong` weights with the
invocation " Answer:", as tests/integration/server/test_alora.py makes it; llama-server with
`--lora-init-without-apply`). Per round, servers alternating: a base call reads a fresh
document and a question; an aLoRA call then sends the same document and question followed by
the invocation (its context before the invocation is the base's: cached on both servers);
then an aLoRA call on another fresh document (nothing cached). Streamed `/v1/completions`
with llama-server's `lora` field, greedy, 8 tokens; the time to the first token of each
aLoRA call, medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import aiohttp
import grpc
from llmserve.service.model.default_model import default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.alora import adapter_dir, load_test_alora
from harness.server import free_port

from .servers import DEFAULT_BUILD, start_llama_server, start_llmserve, stop

QUESTION = "Question: what does the document say about the harbour?"
INVOKE = " Answer:"
WORDS = "harbour ship cargo tide crane dock winter storm ledger captain rope quay fishing market bell".split()


def document(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return "Document. " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\n\n"


async def ttft(session: aiohttp.ClientSession, url: str, prompt: str, lora: list[dict[str, object]]) -> float:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True, "lora": lora}
    start = time.monotonic()
    first = None
    async with session.post(f"{url}/v1/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if first is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                first = time.monotonic() - start
    assert first is not None, "no token came back"
    return first


async def one_round(url: str, alora_id: int, seed: int, words: int) -> tuple[float, float]:
    """(TTFT with the context cached by a base call, TTFT on a fresh context), seconds."""
    lora = [{"id": alora_id, "scale": 1.0}]
    # a connection per call: llama-server closes one after a streamed reply
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(force_close=True)) as session:
        cached = document(seed, words) + QUESTION
        await ttft(session, url, cached, [])
        warm = await ttft(session, url, cached + INVOKE, lora)
        cold = await ttft(session, url, document(seed + 10_000, words) + QUESTION + INVOKE, lora)
    return warm, cold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words", type=int, default=600)
    args = parser.parse_args()
    logs = Path("/tmp/bench-alora")
    logs.mkdir(exist_ok=True)
    flags = ("--adapter-dir", str(adapter_dir()), "--allow-adapter-updates")
    ours, address = start_llmserve(logs / "llmserve.log", (), flags, http_port=(port := free_port()))
    theirs = None
    try:
        path = load_test_alora(pb_grpc.LLMServiceStub(grpc.insecure_channel(address)), QUESTION, INVOKE)
        theirs, their_url = start_llama_server(args.llama_server, default_model_path(), logs / "llama-server.log", False,
                                               ("--lora", str(path), "--lora-init-without-apply"))
        urls = {"llmserve": f"http://127.0.0.1:{port}", "llama-server": their_url}
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
        for r in range(args.rounds):
            for name in (list(urls) if r % 2 == 0 else list(urls)[::-1]):
                rows[name].append(asyncio.run(one_round(urls[name], 0, 100 * r, args.words)))
                print(name, r, [round(1000 * x) for x in rows[name][-1]], flush=True)
    finally:
        stop(ours)
        if theirs is not None:
            stop(theirs)
    for name, results in rows.items():
        warm, cold = (statistics.median(x[i] for x in results) * 1000 for i in (0, 1))
        print(f"{name}: aLoRA TTFT, context cached by a base call {warm:.0f} ms, fresh context {cold:.0f} ms")


if __name__ == "__main__":
    main()

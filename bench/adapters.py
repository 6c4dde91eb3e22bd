"""LoRA adapters side by side with llama-server: G adapters x S streams each on one server.

    python -m bench.adapters [--llama-server PATH] [--groups 4] [--streams 4] [--tokens 64]
                             [--rounds 3] [--out docs/benchmarks.md]

Both servers load the same G adapters (tools/make_adapters.py's files, rank 4-8) and get
the same requests: `/v1/completions` streamed, `lora: [{"id": k, "scale": 1}]`, a distinct
prompt per stream, `--tokens` tokens with ignore_eos, greedy. llama-server starts with
`--lora-init-without-apply` (a request without `lora` runs the base). Two loads per round,
servers alternating: one group alone (S streams under adapter 0) and all G groups at once.
Per load: aggregate tokens/s (completion tokens over the load's wall time) and each
group's gap p99 between streamed chunks. The ceiling one-adapter-set-per-decode allows is
llama-batched-bench's S_TG at S sequences with adapter 0 applied. Also on llmserve: the
time of a run-time LoadAdapter and the largest gap a running stream saw meanwhile; on both,
a long prompt under an adapter while base streams decode (their largest gap meanwhile), and
8 streams under one adapter at one scale against 8 scales (8 sets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

import aiohttp
import grpc
from llmserve.client import pb
from llmserve.service.model.default_model import cache_dir, default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tools.make_adapters import ADAPTERS, AdapterSpec, make_all

from .servers import DEFAULT_BUILD, start_llama_server, start_llmserve, stop

BENCH_ADAPTERS = (*ADAPTERS[1:2], AdapterSpec("fourth", seed=6, rank=8, strength=0.05, targets=("attn_q", "ffn_up")),
                  AdapterSpec("fifth", seed=7, rank=8, strength=0.05, targets=("attn_v", "ffn_gate")),
                  AdapterSpec("sixth", seed=8, rank=4, strength=0.05, targets=("attn_output", "ffn_down")))


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[int, list[float]]:
    """(completion tokens, chunk arrival times) of one streamed completion."""
    times: list[float] = []
    tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                times.append(time.monotonic())
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    return tokens, times


async def load(url: str, groups: int, streams: int, tokens: int, tag: str) -> dict[str, float]:
    """All `groups` x `streams` requests at once; tokens/s and the worst group's gap p99 (ms)."""
    bodies = [(g, {"prompt": f"Story {tag}-{g}-{s}: once upon a time", "max_tokens": tokens, "temperature": 0,
                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                   "lora": [{"id": g, "scale": 1.0}]}) for g in range(groups) for s in range(streams)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.monotonic()
        results = await asyncio.gather(*(_stream(session, url, body) for _, body in bodies))
        wall = time.monotonic() - start
    gaps: dict[int, list[float]] = {}
    for (g, _), (_, times) in zip(bodies, results):
        gaps.setdefault(g, []).extend(1000 * (b - a) for a, b in zip(times, times[1:]))
    p99 = [statistics.quantiles(v, n=100)[98] for v in gaps.values() if len(v) > 2]
    return {"tokens_per_s": sum(n for n, _ in results) / wall, "gap_p99_ms": max(p99)}


def s_tg(build: Path, adapter: Path, streams: int, tokens: int) -> float:
    out = subprocess.run([str(build / "llama-batched-bench"), "-m", str(default_model_path()), "--lora", str(adapter),
                          "-c", "4096", "-b", "512", "-ub", "512", "-npp", "32", "-ntg", str(tokens), "-npl",
                          str(streams), "-t", "2"], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if re.match(r"\|\s+32\s+\|", line))
    return float(row.split("|")[8])


def load_while_streaming(address: str, url: str, path: Path) -> tuple[float, float, float]:
    """(LoadAdapter seconds, a running stream's largest gap meanwhile, its gap p99 before) in ms."""
    async def run() -> tuple[float, float, float]:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "Count slowly:", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
            task = asyncio.create_task(_stream(session, url, body))
            await asyncio.sleep(2.0)
            stub = pb_grpc.LLMServiceStub(grpc.aio.insecure_channel(address))
            t0 = time.monotonic()
            await stub.LoadAdapter(pb.LoadAdapterRequest(name="loaded-late", path=str(path)))
            t1 = time.monotonic()
            _, times = await task
        before = [1000 * (b - a) for a, b in zip(times, times[1:]) if b < t0]
        during = [1000 * (b - a) for a, b in zip(times, times[1:]) if b >= t0 and a <= t1]
        return 1000 * (t1 - t0), max(during, default=0.0), statistics.quantiles(before, n=100)[98]
    return asyncio.run(run())


def prompt_beside_base(url: str) -> tuple[float, float, float]:
    """A ~820-token prompt under adapter 0 while 4 base streams decode: (its TTFT, the base's
    largest gap while it prefilled, the base's gap p50 before it) in ms."""
    async def run() -> tuple[float, float, float]:
        async with aiohttp.ClientSession() as session:
            base = [asyncio.create_task(_stream(session, url, {
                "prompt": f"Count {i}:", "max_tokens": 150, "temperature": 0.8, "ignore_eos": True, "stream": True}))
                for i in range(4)]
            await asyncio.sleep(1.5)
            t0 = time.monotonic()
            prompt = " ".join(f"The river {i} runs past the mill and the old stone bridge." for i in range(55))
            _, times = await _stream(session, url, {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                                    "ignore_eos": True, "stream": True,
                                                    "lora": [{"id": 0, "scale": 1.0}]})
            streams = [t for _, t in await asyncio.gather(*base)]
        during = [1000 * (b - a) for t in streams for a, b in zip(t, t[1:]) if b >= t0 and a <= times[0]]
        before = [1000 * (b - a) for t in streams for a, b in zip(t, t[1:]) if b < t0]
        return 1000 * (times[0] - t0), max(during, default=0.0), statistics.median(before)
    return asyncio.run(run())


def distinct_scales(url: str, streams: int = 8) -> tuple[dict[str, float], dict[str, float]]:
    """`streams` streams under adapter 0 at one scale, then each at a scale of its own (each
    a set of its own): (tokens/s, gap p50, gap p99) of both loads."""
    async def run(scales: list[float]) -> dict[str, float]:
        bodies = [{"prompt": f"Story {i}: once upon a time", "max_tokens": 64, "temperature": 0.8,
                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                   "lora": [{"id": 0, "scale": scale}]} for i, scale in enumerate(scales)]
        async with aiohttp.ClientSession() as session:
            start = time.monotonic()
            results = await asyncio.gather(*(_stream(session, url, body) for body in bodies))
            wall = time.monotonic() - start
        gaps = [1000 * (b - a) for _, t in results for a, b in zip(t, t[1:])]
        return {"tokens_per_s": sum(n for n, _ in results) / wall, "gap_p50_ms": statistics.median(gaps),
                "gap_p99_ms": statistics.quantiles(gaps, n=100)[98]}
    return asyncio.run(run([1.0] * streams)), asyncio.run(run([0.5 + 0.1 * i for i in range(streams)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    directory = cache_dir() / "bench-adapters"
    files = list(make_all(directory, default_model_path(), BENCH_ADAPTERS).values())[: args.groups]
    logs = Path("/tmp/bench-adapters")
    logs.mkdir(exist_ok=True)
    lora_flags = [flag for i, f in enumerate(files) for flag in ("--lora", f"a{i}={f}")]
    ours, address = start_llmserve(logs / "llmserve.log", (), (*lora_flags, "--adapter-dir", str(directory),
                                                              "--allow-adapter-updates"), http_port=(port := _port()))
    theirs, their_url = start_llama_server(args.llama_server, default_model_path(), logs / "llama-server.log", False,
                                           (*[f for path in files for f in ("--lora", str(path))],
                                            "--lora-init-without-apply"))
    urls = {"llmserve": f"http://127.0.0.1:{port}", "llama-server": their_url}
    rows: dict[str, dict[str, list[dict[str, float]]]] = {name: {"alone": [], "mixed": []} for name in urls}
    try:
        for r in range(args.rounds):
            for name in (list(urls) if r % 2 == 0 else list(urls)[::-1]):
                for mode, groups in (("alone", 1), ("mixed", args.groups)):
                    rows[name][mode].append(asyncio.run(load(urls[name], groups, args.streams, args.tokens,
                                                             f"{r}{mode}")))
                    print(name, mode, rows[name][mode][-1], flush=True)
        print("load_while_streaming (ms: load, largest gap, gap p99 before):",
              load_while_streaming(address, urls["llmserve"], files[-1]))
        for name, url in urls.items():
            print(name, "prompt_beside_base (ms: its TTFT, the base's largest gap meanwhile, gap p50 before):",
                  prompt_beside_base(url))
            print(name, "distinct_scales (8 streams under one scale, then 8 scales):", distinct_scales(url))
    finally:
        stop(ours)
        stop(theirs)
    ceiling = s_tg(args.llama_server.parent, files[0], args.streams, args.tokens)
    for name, modes in rows.items():
        for mode, results in modes.items():
            print(name, mode, {k: round(statistics.median(x[k] for x in results), 1) for k in results[0]})
    print(f"S_TG at {args.streams} with adapter 0: {ceiling:.1f} tokens/s")


def _port() -> int:
    from harness.server import free_port

    return free_port()


if __name__ == "__main__":
    main()

"""The HTTP mode: `make bench`'s generate workload as streamed chat over OpenAI's HTTP API,
llmserve (`--http-port`) vs llama-server, both at `/v1/chat/completions`; and the check
that turning llmserve's HTTP server on does not slow gRPC.

    python -m bench.http_chat [--llama-server PATH] [--concurrency 1,4,8,16] [--rounds 2]
                              [--repeat 3] [--grpc-pairs 4] [--grpc-rounds 4] [--only http|grpc]
                              [--out docs/benchmarks.md]

Chat: loadgen's prompts and schedule (each of N workers sends `--rounds` requests back to
back), each prompt one user message; greedy, seed 1, `--max-tokens` new tokens with
ignore_eos; `stream: true` with `stream_options.include_usage`. One client for both servers
(aiohttp, one session per level, SSE read line by line), so the client costs both sides the
same. tokens/s counts `usage.completion_tokens` over the level's wall time; TTFT is request
to the first chunk with content. Both servers get the same chat template file, so the same
prompt tokens (the table shows them). Repetitions alternate which server goes first and use
fresh prompts (later rounds of loadgen's scheme), so no prompt is served from a cache.

gRPC check: two llmserve processes, identical but for `--http-port` (its HTTP server on and
idle), driven by `loadgen.llmserve_level` at `--grpc-concurrency` with `--grpc-rounds`
requests per worker, in ABBA order for `--grpc-pairs` pairs; each pair's prompts are fresh.

All servers start once and stay idle while another is measured. Writes its section into
`--out` between the markers below (bench.run rewrites the rest of the file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from llmserve.client import loadgen
from llmserve.service.engine.chat.chat import PACKAGED_TEMPLATES
from llmserve.service.model.default_model import default_model_path

from .embed_model import write_section
from .servers import (
    CTX,
    DEFAULT_BUILD,
    NP,
    ROOT,
    THREADS,
    free_port,
    start_llama_server,
    start_llmserve,
    stop,
    wait_http,
)

BEGIN, END = "<!-- http-chat -->", "<!-- /http-chat -->"
TEMPLATE = PACKAGED_TEMPLATES["gemma3"]  # llama-server gets the file llmserve ships
SERVERS = ("llmserve", "llama-server")


@dataclass
class ChatLevelResult(loadgen.LevelResult):
    prompt_tokens: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {**super().summary(), "prompt_tokens": statistics.median(self.prompt_tokens or [float("nan")])}


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, object]:
    """The request both servers get: loadgen's generate settings as one streamed chat turn."""
    return {
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "seed": 1, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }


async def _chat_one(session: aiohttp.ClientSession, url: str, body: dict[str, object], result: ChatLevelResult) -> None:
    timer = loadgen._Timer(result)
    usage = None
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for raw in response.content:  # one line at a time; ": ping" comments and blanks skipped
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        timer.token()
        if usage is None:
            raise RuntimeError("the stream ended without a usage chunk")
        result.tokens += int(usage["completion_tokens"])
        result.prompt_tokens.append(int(usage["prompt_tokens"]))
    except Exception:  # noqa: BLE001 - counted as an error, like a failed RPC in loadgen
        result.errors += 1


async def chat_level(
    url: str, concurrency: int, rounds: int, max_tokens: int, prompt: loadgen.PromptFn | None = None
) -> ChatLevelResult:
    """`concurrency` workers send `rounds` streamed chat requests each, after one warm-up."""
    prompt = prompt or loadgen._prompt
    result = ChatLevelResult(concurrency)
    async with loadgen.peer_session() as session:  # a connection per request, for both servers
        async with session.get(f"{url}/v1/models") as response:
            response.raise_for_status()
            model = (await response.json())["data"][0]["id"]
        warm_up = ChatLevelResult(0)
        await _chat_one(session, url, chat_body(model, loadgen.PROMPTS[0], 4), warm_up)
        if warm_up.errors:
            raise RuntimeError(f"{url}: the warm-up chat request failed")

        async def worker(w: int) -> None:
            for r in range(rounds):
                await _chat_one(session, url, chat_body(model, prompt(concurrency, w, r), max_tokens), result)

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


def _fresh(run: int, rounds: int) -> loadgen.PromptFn:
    """loadgen's prompts, rounds `run * rounds` on: a new set for each repetition."""
    return lambda level, worker, round_: loadgen._prompt(level, worker, run * rounds + round_)


def measure_chat(urls: dict[str, str], levels: list[int], rounds: int, repeat: int, max_tokens: int
                 ) -> dict[str, dict[int, list[dict[str, float]]]]:
    """Per server and level, one summary per repetition; the servers take turns going first."""
    runs: dict[str, dict[int, list[dict[str, float]]]] = {name: {level: [] for level in levels} for name in urls}
    for run in range(repeat):
        order = list(urls) if run % 2 == 0 else list(reversed(urls))
        for level in levels:
            for name in order:
                result = asyncio.run(chat_level(urls[name], level, rounds, max_tokens, _fresh(run, rounds)))
                runs[name][level].append(result.summary())
                print(f"{name} c={level}: {result.tokens_per_s:.1f} tok/s, TTFT p50 "
                      f"{result.summary()['ttft_p50_ms']:.0f} ms, errors {result.errors}", flush=True)
    return runs


def measure_grpc(addresses: dict[str, str], concurrency: int, rounds: int, pairs: int, max_tokens: int
                 ) -> dict[str, list[dict[str, float]]]:
    """gRPC summaries per llmserve variant, measured in ABBA order."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in addresses}
    for pair in range(pairs):
        order = list(addresses) if pair % 2 == 0 else list(reversed(addresses))
        for name in order:
            result = asyncio.run(loadgen.llmserve_level(addresses[name], concurrency, rounds, max_tokens,
                                                        _fresh(pair, rounds)))
            runs[name].append(result.summary())
            print(f"gRPC {name} c={concurrency}: {result.tokens_per_s:.1f} tok/s, errors {result.errors}", flush=True)
    return runs


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _median(summaries: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in summaries) if summaries else float("nan")


def section(args: argparse.Namespace, chat: dict[str, dict[int, list[dict[str, float]]]],
            grpc_runs: dict[str, list[dict[str, float]]]) -> str:
    command = " ".join(["python -m bench.http_chat", *args.argv])
    parts = [BEGIN, f"## OpenAI HTTP API (`{command}`)"]
    settings = (f"{NP} slots, {CTX} context, {THREADS} threads, the chat template `engine/chat/templates/gemma3.jinja`; "
                f"greedy, seed 1, {args.max_tokens} new tokens with ignore_eos")
    if chat:
        ours, peer = chat.get("llmserve", {}), chat.get("llama-server", {})
        rows = ["| streams | llmserve tok/s | llama-server tok/s | ratio | TTFT p50 llmserve ms "
                "| TTFT p50 llama-server ms | TTFT ratio | prompt tokens (llmserve / llama-server) | errors |",
                "|---|---|---|---|---|---|---|---|---|"]
        for level in args.levels:
            o, p = ours.get(level, []), peer.get(level, [])
            tok_o, tok_p = _median(o, "tokens_per_s"), _median(p, "tokens_per_s")
            ttft_o, ttft_p = _median(o, "ttft_p50_ms"), _median(p, "ttft_p50_ms")
            errors = sum(s["errors"] for s in o + p)
            rows.append(f"| {level} | {tok_o:.1f} | {tok_p:.1f} | {_ratio(tok_o, tok_p):.2f}x | {ttft_o:.0f} | {ttft_p:.0f} "
                        f"| {_ratio(ttft_o, ttft_p):.2f}x | {_median(o, 'prompt_tokens'):.0f} / "
                        f"{_median(p, 'prompt_tokens'):.0f} | {errors:.0f} |")
        parts += ["", "### Streamed chat: llmserve `--http-port` vs llama-server, `/v1/chat/completions`", "",
                  f"Both servers: {settings}; `stream_options.include_usage`. Each of N workers sends {args.rounds} "
                  f"requests back to back; medians of {args.repeat} repetitions, servers alternately. ratio: "
                  "llmserve / llama-server (tokens/s: higher is better for llmserve; TTFT: lower is).", "", *rows]
    if grpc_runs:
        off, on = grpc_runs["without --http-port"], grpc_runs["with --http-port"]
        rows = ["| llmserve | gRPC tok/s (median) | runs | errors |", "|---|---|---|---|"]
        for name, runs in grpc_runs.items():
            figures = ", ".join(f"{s['tokens_per_s']:.1f}" for s in runs)
            rows.append(f"| {name} | {_median(runs, 'tokens_per_s'):.1f} | {figures} | "
                        f"{sum(s['errors'] for s in runs):.0f} |")
        change = _ratio(_median(on, "tokens_per_s"), _median(off, "tokens_per_s")) - 1
        parts += ["", f"### gRPC with and without `--http-port`, {args.grpc_concurrency} streams", "",
                  f"Two llmserve processes, identical but for `--http-port` (on and idle): {settings}; "
                  f"{args.grpc_rounds} requests per worker, {args.grpc_pairs} pairs of runs in ABBA order.", "", *rows, "",
                  f"With the HTTP server on: {change:+.1%} gRPC tokens/s (median vs median)."]
    return "\n".join([*parts, END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", DEFAULT_BUILD / "llama-server")))
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=2, help="requests per worker")
    parser.add_argument("--repeat", type=int, default=3, help="chat: repetitions per server and level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--grpc-concurrency", type=int, default=16)
    parser.add_argument("--grpc-pairs", type=int, default=4, help="gRPC check: pairs of runs (with, without)")
    parser.add_argument("--grpc-rounds", type=int, default=4, help="gRPC check: requests per worker")
    parser.add_argument("--only", choices=("http", "grpc"), default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    args.levels = [int(c) for c in args.concurrency.split(",")]
    logs = Path("/tmp/llmserve-bench")
    logs.mkdir(exist_ok=True)
    template = ("--chat-template-file", str(TEMPLATE))
    http_port = free_port()
    chat: dict[str, dict[int, list[dict[str, float]]]] = {}
    grpc_runs: dict[str, list[dict[str, float]]] = {}
    ours, address = start_llmserve(logs / "llmserve-http.log", extra=template, http_port=http_port)
    try:
        urls = {"llmserve": f"http://127.0.0.1:{http_port}"}
        wait_http(urls["llmserve"])
        if args.only != "http" and args.grpc_pairs:  # first, while both processes are as fresh
            plain, plain_address = start_llmserve(logs / "llmserve-grpc.log", extra=template)
            try:
                addresses = {"without --http-port": plain_address, "with --http-port": address}
                grpc_runs = measure_grpc(addresses, args.grpc_concurrency, args.grpc_rounds, args.grpc_pairs,
                                         args.max_tokens)
            finally:
                stop(plain)
        if args.only != "grpc":
            peer = None
            if args.llama_server.exists():
                peer, urls["llama-server"] = start_llama_server(
                    args.llama_server, default_model_path(), logs / "llama-server-http.log", False, template)
            else:
                print(f"{args.llama_server} not found: llmserve only (bench/README.md builds it)", flush=True)
            try:
                chat = measure_chat(urls, args.levels, args.rounds, args.repeat, args.max_tokens)
            finally:
                if peer:
                    stop(peer)
    finally:
        stop(ours)
    text = section(args, chat, grpc_runs)
    write_section(args.out, text, BEGIN, END)
    print(text)


if __name__ == "__main__":
    main()

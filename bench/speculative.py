"""Speculative decoding and the prefill budget, llmserve vs llama-server (issue 15).

    python -m bench.speculative [--out docs/benchmarks.md] [--scenarios mixed,fresh] [--only NAME]

Scenarios (greedy; servers measured one at a time, alternately):
* extractive: "repeat the passage above" on ~150-token passages, 160 new tokens, c = 1, 4, 16:
  llmserve with and without `--spec-type ngram-simple`, llama-server with none, ngram-simple
  and ngram-mod;
* non-extractive: the load generator's prompts, 64 tokens, c = 1, 4, 8, 16, speculation on and off;
* mixed: 8 streams decode 256 tokens while 4 fresh prompts of ~1,400 tokens arrive 1.5 s apart:
  ITL p50/p99/max of the 8, TTFT of the 4;
* fresh long prompt: ~900 tokens, c = 1, TTFT.
llama-server comes from /tmp/llama-build/bin (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path

import grpc
from llmserve.client import loadgen, pb
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from .servers import DEFAULT_BUILD, ROOT, start_llama_server, start_llmserve, stop

WORDS = ("river stone market window garden engine letter silver morning harbor winter forest paper "
         "lantern village bridge copper meadow signal orchard").split()


SCENARIOS = ("extractive", "plain", "mixed", "fresh")
MIXED_WORDS = 1300  # about 1,400 tokens
FRESH_WORDS = 840  # about 900 tokens


def _passage(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def extractive(level: int, worker: int, round_: int) -> str:
    text = _passage(level * 1000 + worker * 10 + round_, 110)
    return f"Passage:\n{text}\n\nRepeat the passage above exactly.\nPassage:\n"


def long_prompt(seed: int, words: int) -> str:
    return f"Notes {seed}: " + _passage(seed, words) + "\nSummary:"


def _row(s: dict[str, float]) -> str:
    return f"{s['tokens_per_s']:.1f} | {s['ttft_p50_ms']:.0f} | {s['itl_p50_ms']:.1f} | {s['itl_p99_ms']:.1f}"


async def mixed_on_llmserve(address: str) -> dict[str, float]:
    result = loadgen.LevelResult(8)
    long = loadgen.LevelResult(4)
    done: list[float] = []
    start = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        async def stream(i: int) -> None:
            await loadgen._llmserve_one(stub, f"Stream {i} {time.time()}: count slowly:", 256, result)

        async def late(i: int) -> None:
            await asyncio.sleep(1.5 * (i + 1))
            await loadgen._llmserve_one(stub, long_prompt(int(time.time() * 1000) + i, MIXED_WORDS), 4, long)
            done.append(time.perf_counter() - start - 1.5)  # since the first long prompt arrived

        await asyncio.gather(*(stream(i) for i in range(8)), *(late(i) for i in range(4)))
    return _mixed_summary(result, long, done)


async def mixed_on_peer(url: str) -> dict[str, float]:
    result = loadgen.LevelResult(8)
    long = loadgen.LevelResult(4)
    done: list[float] = []
    start = time.perf_counter()
    async with loadgen.peer_session() as session:
        async def stream(i: int) -> None:
            await loadgen._peer_one(session, url, f"Stream {i} {time.time()}: count slowly:", 256, result)

        async def late(i: int) -> None:
            await asyncio.sleep(1.5 * (i + 1))
            await loadgen._peer_one(session, url, long_prompt(int(time.time() * 1000) + i, MIXED_WORDS), 4, long)
            done.append(time.perf_counter() - start - 1.5)  # since the first long prompt arrived

        await asyncio.gather(*(stream(i) for i in range(8)), *(late(i) for i in range(4)))
    return _mixed_summary(result, long, done)


def _mixed_summary(streams: loadgen.LevelResult, long: loadgen.LevelResult, done: list[float]) -> dict[str, float]:
    s, _ = streams.checked().summary(), long.checked()
    return {"last_done_s": max(done), "itl_p50": s["itl_p50_ms"], "itl_p99": s["itl_p99_ms"], "itl_max": max(streams.itl_ms),
            "long_ttft_min": min(long.ttft_ms), "long_ttft_max": max(long.ttft_ms), "itl_ms": list(streams.itl_ms),
            "long_ttft_s": sorted(t / 1000 for t in long.ttft_ms)}


async def fresh_long_prompt(address: str | None, url: str | None) -> float:
    ttfts = []
    for i in range(3):
        result = loadgen.LevelResult(1)
        prompt = long_prompt(int(time.time() * 1000) + i, FRESH_WORDS)
        if address:
            async with grpc.aio.insecure_channel(address) as channel:
                await loadgen._llmserve_one(pb_grpc.LLMServiceStub(channel), prompt, 2, result)
        else:
            async with loadgen.peer_session() as session:
                await loadgen._peer_one(session, url, prompt, 2, result)
        ttfts.append(result.checked().ttft_ms[0])
    return statistics.median(ttfts)


def _count_tokens(address: str, text: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return len(pb_grpc.LLMServiceStub(channel).Tokenize(pb.TokenizeRequest(text=text, add_special=True)).ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="", help="run only the servers whose name contains this")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of {SCENARIOS}")
    parser.add_argument("--with-unified", action="store_true", help="also llmserve with -kvu (one KV buffer for all slots)")
    args = parser.parse_args()
    scenarios = set(args.scenarios.split(","))
    if scenarios - set(SCENARIOS):
        parser.error(f"unknown scenarios {sorted(scenarios - set(SCENARIOS))}")
    logs = ROOT / "build" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    ext_levels, plain_levels = (1, 4, 16), (1, 4, 8, 16)
    ctx = ("-c", "32768")  # 2,048 tokens per slot: the mixed load's prompts are ~1,400 tokens
    ours = {"llmserve, speculation off": (*ctx, "--spec-type", "none"),
            "llmserve, --spec-type ngram-simple": (*ctx, "--spec-type", "ngram-simple")}
    if args.with_unified:
        ours["llmserve -kvu, speculation off"] = (*ctx, "--spec-type", "none", "-kvu")
    peers = {"llama-server, no speculation": ctx, "llama-server --spec-type ngram-simple": (*ctx, "--spec-type", "ngram-simple"),
             "llama-server --spec-type ngram-mod": (*ctx, "--spec-type", "ngram-mod")}
    table: dict[str, dict[str, str]] = {}
    mixed_itls: dict[str, list[float]] = {}
    sizes = ""
    for name, flags in [*ours.items(), *peers.items()]:
        is_peer = name.startswith("llama")
        if args.only and args.only not in name:
            continue
        if is_peer and not args.llama_server.exists():
            continue
        if is_peer:
            process, url = start_llama_server(args.llama_server, peer_model(), logs / "peer.log", False, flags)
        else:
            process, url = start_llmserve(logs / "ours.log", ("--embeddings", *flags))
        try:
            if not sizes:
                sizes = "prompts of ~150 tokens"
            row = table.setdefault(name, {})
            for level in ext_levels if "extractive" in scenarios else ():
                run = loadgen.peer_level if is_peer else loadgen.llmserve_level
                r = asyncio.run(run(url, level, 2 if level == 1 else 1, 160, extractive)).checked()
                row[f"ext{level}"] = f"{r.tokens_per_s:.1f}"
                print(name, "extractive", level, _row(r.summary()), flush=True)
            if "ngram-mod" in name or ("simple" in name and is_peer):
                continue
            for level in plain_levels if "plain" in scenarios else ():
                run = loadgen.peer_level if is_peer else loadgen.llmserve_level
                r = asyncio.run(run(url, level, 1, 64)).checked()
                row[f"plain{level}"] = f"{r.tokens_per_s:.1f}"
                print(name, "plain", level, _row(r.summary()), flush=True)
            if "mixed" in scenarios:
                mixed = asyncio.run(mixed_on_peer(url) if is_peer else mixed_on_llmserve(url))
                mixed_itls[name] = mixed["itl_ms"]
                ttfts = mixed["long_ttft_s"]
                row["mixed"] = (f"{mixed['itl_p50']:.0f} / {mixed['itl_p99']:.0f} / {mixed['itl_max']:.0f} ms "
                                f"(p99 = {mixed['itl_p99'] / mixed['itl_p50']:.2f}x p50) | "
                                + ", ".join(f"{t:.1f}" for t in ttfts) + f" s (mean {statistics.mean(ttfts):.1f})")
                print(name, "mixed", row["mixed"], flush=True)
            if "fresh" in scenarios:
                row["fresh"] = f"{asyncio.run(fresh_long_prompt(None if is_peer else url, url if is_peer else None)):.0f}"
                print(name, "fresh long TTFT", row["fresh"], flush=True)
        finally:
            stop(process)
    lines.append(f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python -m bench.speculative`; "
                 f"extractive {sizes}, 160 new tokens, greedy; tokens/s aggregate over all streams.\n")
    cols = [f"ext{c}" for c in ext_levels] + [f"plain{c}" for c in plain_levels]
    lines.append("| server | " + " | ".join(
        [f"extractive c={c}" for c in ext_levels] + [f"plain c={c}" for c in plain_levels]) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(row.get(c, "") for c in cols) + " |")
    lines.append("\n| server | mixed load: ITL p50 / p99 / max of the 8 streams | TTFT of the 4 long prompts | "
                 "fresh ~900-token prompt TTFT ms |")
    lines.append("|---|---|---|---|")
    for name, row in table.items():
        if "mixed" in row or "fresh" in row:
            lines.append(f"| {name} | {row.get('mixed', ' | ')} | {row.get('fresh', '')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        plot = args.out.with_name("benchmarks-speculative.png")
        _plot(plot, table, cols, mixed_itls)
        text += f"\n![extractive and plain tokens/s; inter-token latency under the mixed load]({plot.name})\n"
        body = args.out.read_text()
        marker = "<!-- speculative -->"
        head = body.split(marker)[0].rstrip() + "\n\n" if marker in body else body.rstrip() + "\n\n## Speculative decoding and the prefill budget\n\n"
        tail = body.split(marker)[2] if body.count(marker) >= 2 else ""
        args.out.write_text(head + marker + "\n" + text + marker + tail)


def _plot(path: Path, table: dict[str, dict[str, str]], cols: list[str], mixed_itls: dict[str, list[float]]) -> None:
    """Tokens/s per scenario column and server; the CDF of the 8 streams' inter-token
    latency under the mixed load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    measured = [c for c in cols if any(c in row for row in table.values())]
    width = 0.8 / max(len(table), 1)
    for i, (name, row) in enumerate(table.items()):
        values = [float(row[c]) if c in row else 0.0 for c in measured]
        a.bar([x + i * width for x in range(len(measured))], values, width, label=name)
    a.set_xticks([x + 0.4 - width / 2 for x in range(len(measured))], [c.replace("ext", "extr. c=").replace("plain", "plain c=") for c in measured])
    a.set(ylabel="generated tokens/s", title="Throughput (greedy)")
    a.legend(fontsize=7)
    for name, itl in mixed_itls.items():
        ordered = sorted(itl)
        b.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    b.set(xscale="log", xlabel="inter-token latency, ms (log)", ylabel="fraction of tokens",
          title="Mixed load: 8 streams while 4 long prompts arrive")
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def peer_model() -> Path:
    from llmserve.service.model.default_model import default_model_path

    return default_model_path()


if __name__ == "__main__":
    main()

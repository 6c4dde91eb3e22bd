"""`make bench`: llmserve vs llama-server vs the llama-batched-bench decode ceiling,
side by side in one run; writes docs/benchmarks.md and docs/benchmarks.png.

    python -m bench.run [--llama-server PATH] [--batched-bench PATH] [--repeat 3]

The peer binaries are built locally from the llama.cpp vendored in the
llama-cpp-python sdist (bench/README.md); without them only llmserve is measured.
Figures are medians of `--repeat` runs; the servers are measured alternately, never
at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llmserve.client import loadgen
from llmserve.service.model.default_model import default_model_path

from . import embed_model
from .servers import CTX, DEFAULT_BUILD, NP, ROOT, THREADS, start_llama_server, start_llmserve, stop


def run_batched_bench(binary: Path, model: Path, levels: list[int]) -> dict[int, float]:
    out = subprocess.run(
        [str(binary), "-m", str(model), "-c", str(CTX), "-b", "512", "-ub", "512", "-npp", "16", "-ntg", "64",
         "-npl", ",".join(map(str, levels)), "-t", str(THREADS)],
        capture_output=True, text=True, timeout=900,
    ).stdout
    ceiling = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0].isdigit() and cells[2].isdigit():
            ceiling[int(cells[2])] = float(cells[7])  # S_TG t/s
    return ceiling


def _median_levels(runs: list[dict[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    return {
        level: {k: statistics.median(r[level][k] for r in runs) for k in runs[0][level]}
        for level in runs[0]
    }


def _engine_table(levels: list[int]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--concurrency", ",".join(map(str, levels))],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    ).stdout
    return "\n".join(line for line in out.splitlines() if line.startswith("|"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=Path(os.environ.get("LLAMA_SERVER", DEFAULT_BUILD / "llama-server")))
    parser.add_argument("--batched-bench", type=Path, default=Path(os.environ.get("LLAMA_BATCHED_BENCH", DEFAULT_BUILD / "llama-batched-bench")))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = default_model_path()
    logs = Path("/tmp/llmserve-bench")
    logs.mkdir(exist_ok=True)
    have_peer = args.llama_server.exists()

    ours: list[dict[int, dict[str, float]]] = []
    peer: list[dict[int, dict[str, float]]] = []
    embed: dict[str, tuple[float, float]] = {}
    process, address = start_llmserve(logs / "llmserve.log")
    peer_process = None
    try:
        if have_peer:
            peer_process, peer_url = start_llama_server(args.llama_server, model, logs / "llama-server.log", False)
        for _ in range(args.repeat):
            ours.append({})
            peer.append({})
            for level in levels:
                ours[-1][level] = asyncio.run(loadgen.llmserve_level(address, level, args.rounds, 64)).checked().summary()
                if have_peer:
                    peer[-1][level] = asyncio.run(loadgen.peer_level(peer_url, level, args.rounds, 64)).checked().summary()
        embed["llmserve"] = asyncio.run(loadgen.llmserve_embed(address, loadgen.CORPUS))
    finally:
        stop(process)
        if peer_process:
            stop(peer_process)
    if have_peer:
        peer_process, peer_url = start_llama_server(args.llama_server, model, logs / "llama-server-embed.log", True)
        try:
            embed["llama-server"] = asyncio.run(loadgen.peer_embed(peer_url, loadgen.CORPUS))
        finally:
            stop(peer_process)
    ceiling = run_batched_bench(args.batched_bench, model, levels) if args.batched_bench.exists() else {}
    engine = _engine_table(levels)
    write_report(args, levels, _median_levels(ours), _median_levels(peer) if have_peer else {}, ceiling, embed, engine)

    embed_model.write_section(args.out, embed_model.section(embed_model.measure(args.llama_server, args.repeat), args.repeat))


def write_report(args, levels, ours, peer, ceiling, embed, engine) -> None:  # type: ignore[no-untyped-def]
    import importlib.metadata as md

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    rows = ["| streams | llmserve tok/s | llama-server tok/s | ratio | batched-bench S_TG | llmserve / ceiling "
            "| TTFT p50 llmserve ms | TTFT p50 llama-server ms | ITL p50 llmserve ms | ITL p99 llmserve ms | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for level in levels:
        o = ours[level]
        p = peer.get(level)
        c = ceiling.get(level)
        rows.append(
            f"| {level} | {o['tokens_per_s']:.1f} | {p['tokens_per_s'] if p else float('nan'):.1f} "
            f"| {o['tokens_per_s'] / p['tokens_per_s'] if p else float('nan'):.2f}x | {c if c else float('nan'):.1f} "
            f"| {o['tokens_per_s'] / c if c else float('nan'):.0%} | {o['ttft_p50_ms']:.0f} "
            f"| {p['ttft_p50_ms'] if p else float('nan'):.0f} | {o['itl_p50_ms']:.1f} | {o['itl_p99_ms']:.1f} "
            f"| {o['errors']:.0f} |"
        )
    embed_rows = ["| server | texts/s | tokens/s |", "|---|---|---|"]
    embed_rows += [f"| {name} | {t:.1f} | {k:.0f} |" for name, (t, k) in embed.items()]
    text = f"""# Benchmarks

Generated by `make bench` (`python -m bench.run --repeat {args.repeat} --rounds {args.rounds}`) on
{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Machine: {os.cpu_count()} cores, {cpu}.
Versions: llmserve {md.version('llmserve')}, llama-cpp-python {md.version('llama-cpp-python')}
(llama.cpp vendored in its sdist; llama-server and llama-batched-bench built from that same
tree, see bench/README.md). Model: gemma-3-270m Q4_K_M. Both servers: {NP} slots, {CTX}
context, {THREADS} threads; llmserve runs with `--embeddings` as `make serve` does.
Load: greedy, seed 1, 64 new tokens with ignore_eos, each of N workers sending {args.rounds}
requests back to back; medians of {args.repeat} repetitions, servers measured alternately.

## Generate

{chr(10).join(rows)}

![tokens/s and TTFT vs concurrency](benchmarks.png)

## Embed (256 texts of ~25 tokens)

{chr(10).join(embed_rows)}

llama-server: `/embedding` with 32 texts per request, 4 requests in flight, `--embeddings --pooling mean`.
llmserve: one Embed stream, 32 texts per message.

## Engine alone (no gRPC): `python -m bench.engine`

{engine}
"""
    args.out.write_text(text)
    _plot(args.out.with_suffix(".png"), levels, ours, peer, ceiling)
    print(text)


def _plot(path: Path, levels, ours, peer, ceiling) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(levels, [ours[x]["tokens_per_s"] for x in levels], "o-", label="llmserve")
    if peer:
        a.plot(levels, [peer[x]["tokens_per_s"] for x in levels], "s-", label="llama-server")
    if ceiling:
        a.plot(levels, [ceiling.get(x, float("nan")) for x in levels], "k--", label="llama-batched-bench S_TG")
    a.set(xlabel="concurrent streams", ylabel="generated tokens/s", title="Throughput")
    b.plot(levels, [ours[x]["ttft_p50_ms"] for x in levels], "o-", label="llmserve")
    if peer:
        b.plot(levels, [peer[x]["ttft_p50_ms"] for x in levels], "s-", label="llama-server")
    b.set(xlabel="concurrent streams", ylabel="ms", title="Time to first token, p50")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_xticks(levels)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

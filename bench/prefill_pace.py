"""The prefill pacer's one knob, measured: smooth streams vs long-prompt TTFT and throughput.

    python -m bench.prefill_pace [--max-itl-ms auto,500,1000] [--repeat 1] [--out docs/benchmarks.md]

For each `--max-itl-ms` value (`auto`: the default, no flag) a fresh llmserve runs the mixed load of
`bench.speculative` (8 streams decode 256 tokens while 4 fresh ~1,400-token prompts arrive
1.5 s apart) and then the extractive c=16 burst (16 prompts of ~150 tokens at once, 160
tokens each); llama-server (from /tmp/llama-build/bin, bench/README.md) runs the same two
as the reference. Servers one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from llmserve.client import loadgen

from .servers import DEFAULT_BUILD, ROOT, start_llama_server, start_llmserve, stop
from .speculative import extractive, mixed_on_llmserve, mixed_on_peer, peer_model

MARKER = "<!-- prefill-pace -->"


def _measure(url: str, is_peer: bool) -> str:
    mixed = asyncio.run(mixed_on_peer(url) if is_peer else mixed_on_llmserve(url))
    run = loadgen.peer_level if is_peer else loadgen.llmserve_level
    burst = asyncio.run(run(url, 16, 1, 160, extractive)).checked()
    ttfts = mixed["long_ttft_s"]
    s = burst.summary()
    return (f"{mixed['itl_p50']:.0f} / {mixed['itl_p99']:.0f} / {mixed['itl_max']:.0f} ms "
            f"({mixed['itl_p99'] / mixed['itl_p50']:.2f}x) | " + ", ".join(f"{t:.1f}" for t in ttfts)
            + f" s (mean {statistics.mean(ttfts):.1f}) | {mixed['last_done_s']:.1f} s | {burst.tokens_per_s:.1f} | {s['ttft_p50_ms']:.0f} | "
            f"{s['itl_p99_ms']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-itl-ms", default="auto,500,1000", help="values to compare; auto: the default (no flag); '-kvu ...': other flags")
    parser.add_argument("--repeat", type=int, default=1, help="each value and llama-server this many times, in turn")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logs = ROOT / "build" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    ctx = ("-c", "32768")
    rows = []
    for rep in range(args.repeat):
        tag = f"{chr(ord('a') + rep)}: " if args.repeat > 1 else ""
        for k in args.max_itl_ms.split(","):
            flag = () if k == "auto" else tuple(k.split()) if k.startswith("-") else ("--max-itl-ms", k)
            process, url = start_llmserve(logs / "ours.log", ("--embeddings", *ctx, *flag))
            try:
                rows.append(f"| {tag}llmserve {' '.join(flag) or '(default: auto)'} | {_measure(url, False)} |")
            finally:
                stop(process)
            print(rows[-1], flush=True)
        if args.llama_server.exists():
            process, url = start_llama_server(args.llama_server, peer_model(), logs / "peer.log", False, ctx)
            try:
                rows.append(f"| {tag}llama-server | {_measure(url, True)} |")
            finally:
                stop(process)
            print(rows[-1], flush=True)
    text = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python -m bench.prefill_pace`, "
        "one run per row, servers one at a time.\n",
        "| server | mixed load: ITL p50 / p99 / max (p99/p50) | TTFT of the 4 long prompts | "
        "last long prompt done | extractive c=16 tokens/s | its TTFT p50 ms | its ITL p99 ms |",
        "|---|---|---|---|---|---|---|", *rows]) + "\n"
    print(text)
    if args.out:
        body = args.out.read_text()
        if body.count(MARKER) >= 2:
            head, _, tail = body.split(MARKER, 2)
            args.out.write_text(head + MARKER + "\n" + text + MARKER + tail)
        else:
            args.out.write_text(body.rstrip() + "\n\n### The prefill pacer's knob\n\n" + MARKER + "\n" + text + MARKER + "\n")


if __name__ == "__main__":
    main()

"""Issue 25's targets in one run, one table: llmserve (default flags) vs llama-server.

    python -m bench.targets [--rounds 3] [--out docs/benchmarks.md] [--only-plain]

Servers are measured one at a time (two may be up, idle, at once). Each row: what was
measured, the goal, and whether it was met in this run. Plain, under both of loadgen's
workloads (rounds of unique-head prompts, greedy; a pool of callers taking shared-head
prompts, temperature 0.8): 64 tokens, `--rounds` rounds with the order swapped each round
(median and lowest ratio).
Extractive: bench.speculative's passages, llmserve and llama-server with `--spec-type
ngram-simple` and with `ngram-mod` up at once, `--rounds` alternating rounds, the median
ratio over the better llama-server of each round. Speculation on / off: two llmserve up at once, `--rounds`
alternating rounds, the median ratio. Mixed load and fresh long prompts: bench.speculative's.
Ceiling: llama-batched-bench S_TG at 16. Embed: bench.embed_model (MiniLM). Memory: idle
RSS at `-np 4 -c 8192`, and what a round of Embed adds with `--embeddings`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from llmserve.client import loadgen
from llmserve.service.model.default_model import default_model_path

from . import embed_model
from .run import run_batched_bench
from .servers import DEFAULT_BUILD, ROOT, start_llama_server, start_llmserve, stop
from .speculative import extractive, fresh_long_prompt, mixed_on_llmserve, mixed_on_peer

MARKER = "<!-- targets -->"
PLAIN_LEVELS = (1, 4, 8, 16)
LOGS = ROOT / "build" / "bench-logs"
Row = tuple[str, str, str, bool]  # target, measured, goal, met


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


Level = Callable[..., Awaitable[loadgen.LevelResult]]
Prompt = Callable[[int, int, int], str]  # (level, worker, request) -> prompt


def _prompt(rnd: int) -> Prompt:
    return lambda level, worker, request: f"Round {rnd}.{request} of {level}, worker {worker}: " + \
        loadgen.PROMPTS[worker % len(loadgen.PROMPTS)]


def _pool_prompt(rnd: int) -> Prompt:
    return lambda level, caller, request: f"{loadgen.PROMPTS[request % len(loadgen.PROMPTS)]} (#{rnd}.{level}.{request})"


# The plain rows' two workloads (loadgen.WORKLOADS): each caller's own rounds of unique-head
# prompts, greedy; and a pool of callers taking 3c shared-head prompts, temperature 0.8
PLAIN_WORKLOADS = ((loadgen.ROUNDS, _prompt, lambda level: 2), (loadgen.POOL, _pool_prompt, lambda level: 3))


def alternate(
    servers: dict[str, tuple[Level, str]], rounds: int, label: str = "plain", levels: tuple[int, ...] = PLAIN_LEVELS,
    max_tokens: int = 64, prompts: Callable[[int], Prompt] = _prompt, num_requests: Callable[[int], int] = lambda level: 2,
    workload: loadgen.Workload = loadgen.ROUNDS,
) -> tuple[dict[str, dict[int, list[float]]], ...]:
    """A load on each server (runner, address), by default the plain rows': `rounds` rounds
    over `levels`, the servers' order swapped each round, `prompts(round)` the round's
    prompts under `workload`'s sampling and arrivals. Returns tokens/s and TTFT p50, by
    server name and level, one entry a round."""
    tps: dict[str, dict[int, list[float]]] = {name: {} for name in servers}
    ttft: dict[str, dict[int, list[float]]] = {name: {} for name in servers}
    names = list(servers)
    for rnd in range(rounds):
        for level in levels:
            for name in names if rnd % 2 == 0 else reversed(names):
                run, url = servers[name]
                s = asyncio.run(run(url, level, num_requests(level), max_tokens, prompts(rnd),
                                    workload=workload)).checked().summary()
                tps[name].setdefault(level, []).append(s["tokens_per_s"])
                ttft[name].setdefault(level, []).append(s["ttft_p50_ms"])
            print(f"{label} round {rnd} c={level}: " + " vs ".join(f"{tps[n][level][-1]:.1f}" for n in names), flush=True)
    return tps, ttft


def plain(peer: Path, rounds: int) -> tuple[list[Row], dict[int, float]]:
    ours, url_ours = start_llmserve(LOGS / "targets-ours.log")
    theirs, url_theirs = start_llama_server(peer, default_model_path(), LOGS / "targets-peer.log", False)
    servers = {"ours": (loadgen.llmserve_level, url_ours), "peer": (loadgen.peer_level, url_theirs)}
    rows: list[Row] = []
    ours_tps: dict[int, float] = {}
    try:
        for workload, prompts, num_requests in PLAIN_WORKLOADS:
            tps, ttft = alternate(servers, rounds, f"plain ({workload.name})", prompts=prompts,
                                  num_requests=num_requests, workload=workload)
            rows += plain_rows(tps, ttft, "ours", "peer", workload.name)
            ours_tps = ours_tps or {level: statistics.median(tps["ours"][level]) for level in PLAIN_LEVELS}
    finally:
        stop(ours)
        stop(theirs)
    return rows, ours_tps


def plain_rows(tps: dict[str, dict[int, list[float]]], ttft: dict[str, dict[int, list[float]]], a: str, b: str,
               workload: str = loadgen.ROUNDS.name) -> list[Row]:
    """The plain rows' goals, server `a` over server `b`, from `alternate`'s results."""
    rows: list[Row] = []
    for level in PLAIN_LEVELS:
        ratios = [x / y for x, y in zip(tps[a][level], tps[b][level])]
        med, low = statistics.median(ratios), min(ratios)
        rows.append((f"plain ({workload}) c={level} tokens/s", f"median {med:.2f}x, lowest {low:.2f}x "
                     f"({', '.join(f'{r:.2f}' for r in ratios)})", ">= 1.0x, none < 0.9x", med >= 1.0 and low >= 0.9))
        t = [x / y for x, y in zip(ttft[a][level], ttft[b][level])]
        rows.append((f"plain ({workload}) c={level} TTFT p50", f"median {statistics.median(t):.2f}x ({', '.join(f'{r:.2f}' for r in t)})",
                     "<= 1.0x", statistics.median(t) <= 1.0))
    return rows


EXTRACTIVE_LEVELS = (1, 4, 16)


def _extractive(peer: Path, ctx: tuple[str, ...], rounds: int) -> list[Row]:
    """Extractive work on llmserve and on llama-server with each `--spec-type`, all three
    up at once, measured one at a time in `rounds` alternating rounds: one ratio a round,
    over the better llama-server of that round (single runs minutes apart moved with the
    machine's speed)."""
    ours, url_ours = start_llmserve(LOGS / "targets-ours.log", extra=ctx)
    processes, servers = [ours], {"llmserve": (loadgen.llmserve_level, url_ours)}
    try:
        for spec in ("ngram-simple", "ngram-mod"):
            process, url = start_llama_server(peer, default_model_path(), LOGS / f"targets-peer-{spec}.log", False,
                                              (*ctx, "--spec-type", spec))
            processes.append(process)
            servers[spec] = (loadgen.peer_level, url)
        tps, _ = alternate(servers, rounds, "extractive", EXTRACTIVE_LEVELS, 160, _extractive_prompt,
                           lambda level: 2 if level == 1 else 1)
    finally:
        for process in processes:
            stop(process)
    rows: list[Row] = []
    for level, goal in zip(EXTRACTIVE_LEVELS, (1.10, 1.0, 1.0)):
        best = [max(s, m) for s, m in zip(tps["ngram-simple"][level], tps["ngram-mod"][level])]
        ratios = [o / b for o, b in zip(tps["llmserve"][level], best)]
        med = statistics.median(ratios)
        rows.append((f"extractive c={level} vs llama-server's best --spec-type",
                     f"median {med:.2f}x ({', '.join(f'{r:.2f}' for r in ratios)}; medians {statistics.median(tps['llmserve'][level]):.1f} "
                     f"vs {statistics.median(best):.1f})", f">= {goal:.2f}x", med >= goal))
    return rows


def _extractive_prompt(rnd: int) -> Prompt:
    return lambda level, worker, request: extractive(level, worker, request + 10 * rnd)


def _spec_on_off(url_on: str, url_off: str, rounds: int) -> dict[int, list[float]]:
    """Plain work on speculation on / off, per level: one ratio a round, the order swapped
    each round (one pair of single runs was within the machine's noise of 1.0 either way)."""
    ratios: dict[int, list[float]] = {}
    for rnd in range(rounds):
        for level in PLAIN_LEVELS:
            tps = {}
            for url in (url_on, url_off) if rnd % 2 == 0 else (url_off, url_on):
                tps[url] = asyncio.run(loadgen.llmserve_level(url, level, 1, 64, _prompt(7 + rnd))).checked().tokens_per_s
            ratios.setdefault(level, []).append(tps[url_on] / tps[url_off])
            print(f"speculation round {rnd} c={level}: on/off {ratios[level][-1]:.2f}", flush=True)
    return ratios


def speculation(peer: Path, rounds: int) -> list[Row]:
    ctx = ("-c", "32768")
    rows = _extractive(peer, ctx, rounds)
    process, url = start_llmserve(LOGS / "targets-ours.log", extra=ctx)
    try:
        mixed_ours = asyncio.run(mixed_on_llmserve(url))
        fresh_ours = asyncio.run(fresh_long_prompt(url, None))
    finally:
        stop(process)
    # Both fresh: a server that has served the loads above holds their cached prefixes.
    on, url_on = start_llmserve(LOGS / "targets-ours.log", extra=ctx)
    off, url_off = start_llmserve(LOGS / "targets-ours-off.log", extra=(*ctx, "--spec-type", "none"))
    try:
        on_off = _spec_on_off(url_on, url_off, rounds)
    finally:
        stop(on)
        stop(off)
    process, url = start_llama_server(peer, default_model_path(), LOGS / "targets-peer.log", False, ctx)
    try:
        mixed_peer = asyncio.run(mixed_on_peer(url))
        fresh_peer = asyncio.run(fresh_long_prompt(None, url))
    finally:
        stop(process)
    for level in PLAIN_LEVELS:
        r = statistics.median(on_off[level])
        rows.append((f"speculation on / off, plain c={level}", f"median {r:.2f}x ({', '.join(f'{x:.2f}' for x in on_off[level])})",
                     ">= 1.0x (no regression)", r >= 1.0))
    mean_ttft = statistics.mean(mixed_ours["long_ttft_s"]) / statistics.mean(mixed_peer["long_ttft_s"])
    for name, value, goal, limit in (
        ("mixed: mean long-prompt TTFT", mean_ttft, "<= 1.1x", 1.1),
        ("mixed: last prompt done", mixed_ours["last_done_s"] / mixed_peer["last_done_s"], "<= 1.1x", 1.1),
        ("mixed: ITL p99", mixed_ours["itl_p99"] / mixed_peer["itl_p99"], "<= 0.25x", 0.25),
        ("mixed: ITL p50", mixed_ours["itl_p50"] / mixed_peer["itl_p50"], "<= 1.2x", 1.2),
        ("fresh ~900-token prompt TTFT", fresh_ours / fresh_peer, "<= 1.0x", 1.0),
    ):
        rows.append((name, f"{value:.2f}x", goal, value <= limit))
    return rows


def ceiling(batched_bench: Path, ours_c16: float) -> list[Row]:
    s_tg = run_batched_bench(batched_bench, default_model_path(), [16]).get(16)
    if not s_tg:
        return []
    r = ours_c16 / s_tg
    return [("gRPC c=16 / llama-batched-bench S_TG", f"{100 * r:.0f}% ({ours_c16:.1f} / {s_tg:.1f})", ">= 90%", r >= 0.9)]


def embed(peer: Path) -> list[Row]:
    results = embed_model.measure(peer, 1)
    rows: list[Row] = []
    for corpus, by_server in results.items():
        r = by_server["llmserve"][0] / by_server["llama-server"][0]
        rows.append((f"Embed MiniLM texts/s, {corpus}", f"{r:.2f}x", ">= 1.05x", r >= 1.05))
    return rows


def memory(peer: Path) -> list[Row]:
    small = ("-np", "4", "-c", "8192")
    process, url = start_llmserve(LOGS / "targets-mem.log", embed_args=(), extra=small)
    try:
        time.sleep(2)
        ours = _rss_mib(process.pid)
    finally:
        stop(process)
    process, _ = start_llama_server(peer, default_model_path(), LOGS / "targets-peer-mem.log", False, small)
    try:
        time.sleep(2)
        theirs = _rss_mib(process.pid)
    finally:
        stop(process)
    process, url = start_llmserve(LOGS / "targets-mem.log", extra=small)
    try:
        before = _rss_mib(process.pid)
        asyncio.run(loadgen.llmserve_embed(url, embed_model.PASSAGES))
        grown = _rss_mib(process.pid) - before
    finally:
        stop(process)
    return [("idle RSS at -np 4 -c 8192", f"{ours / theirs:.2f}x ({ours} vs {theirs} MiB)", "<= 1.15x", ours / theirs <= 1.15),
            ("--embeddings: RSS added by Embed of 256 passages", f"{grown} MiB", "no +470 MiB", grown < 100)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--batched-bench", type=Path, default=DEFAULT_BUILD / "llama-batched-bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only-plain", action="store_true", help="the plain rows alone (both workloads), printed")
    args = parser.parse_args()
    if not args.llama_server.exists():
        parser.error(f"{args.llama_server} not found: build it as bench/README.md says")
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows, ours_tps = plain(args.llama_server, args.rounds)
    if not args.only_plain:
        rows += ceiling(args.batched_bench, ours_tps[16]) if args.batched_bench.exists() else []
        rows += speculation(args.llama_server, args.rounds)
        rows += embed(args.llama_server)
        rows += memory(args.llama_server)
    report(rows, f"Measured {started} to {time.strftime('%H:%M UTC', time.gmtime())} with `python -m bench.targets "
           f"--rounds {args.rounds}`, one run, servers one at a time.", "| target | measured (llmserve / llama-server) | goal | met |",
           None if args.only_plain else args.out, MARKER)


def report(rows: list[Row], intro: str, header: str, out: Path | None, marker: str, missed: str = "**no**") -> None:
    """Print the rows as a table under `intro`; with `out`, also into its `marker` section."""
    text = "\n".join([intro + "\n", header, "|---|---|---|---|",
                      *(f"| {t} | {m} | {g} | {'yes' if ok else missed} |" for t, m, g, ok in rows)]) + "\n"
    print(text)
    if out:
        embed_model.write_section(out, marker + "\n" + text + marker, marker, marker)


if __name__ == "__main__":
    main()

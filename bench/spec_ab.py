"""Speculation on vs off on plain work, A/B: two llmserve processes (`--spec-type none` and
`--spec-type ngram-simple`) up at once, measured one at a time, the order swapped every
round, fresh prompts per round (loadgen's prompts, greedy, 64 tokens, ignore_eos).

    python -m bench.spec_ab [--concurrency 1,2,4,8] [--rounds 2]

Prints tokens/s of each and the ratio on/off per round and level: the "never a loss" check.
"""

from __future__ import annotations

import argparse
import asyncio

from llmserve.client import loadgen

from .servers import ROOT, start_llmserve, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2, help="requests per worker")
    args = parser.parse_args()
    logs = ROOT / "build" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    off, addr_off = start_llmserve(logs / "spec-off.log", extra=("--spec-type", "none"))
    on, addr_on = start_llmserve(logs / "spec-on.log", extra=("--spec-type", "ngram-simple"))
    try:
        print("| round | streams | off tokens/s | on tokens/s | on / off |\n|---|---|---|---|---|")
        for rnd in range(args.rounds):
            for level in (int(c) for c in args.concurrency.split(",")):
                pair = [("off", addr_off), ("on", addr_on)]
                tps = {}
                for name, address in pair if rnd % 2 == 0 else reversed(pair):
                    def prompt(_level: int, worker: int, request: int, rnd: int = rnd) -> str:
                        return f"Round {rnd}.{request} worker {worker}: {loadgen.PROMPTS[worker % len(loadgen.PROMPTS)]}"

                    tps[name] = asyncio.run(loadgen.llmserve_level(address, level, args.requests, 64, prompt)).checked().tokens_per_s
                print(f"| {rnd} | {level} | {tps['off']:.1f} | {tps['on']:.1f} | {tps['on'] / tps['off']:.2f} |", flush=True)
    finally:
        stop(off)
        stop(on)


if __name__ == "__main__":
    main()

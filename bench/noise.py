"""A/A: what the machine's noise alone does to bench.targets' plain rows.

    python -m bench.noise [--server llama-server|llmserve] [--rounds 3] [--out docs/benchmarks.md]

Two servers of one build with the same flags, up at once, get exactly the load of
bench.targets' plain rows (both workloads, same prompts and levels, `--rounds` rounds, the order swapped
each round), and the same goals are applied to the first over the second. Any ratio away
from 1.0 is noise: a goal that a server misses against itself is one that no build can be
sure to meet on this machine, and one it meets by chance says how little a pass proves.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from llmserve.client import loadgen
from llmserve.service.model.default_model import default_model_path

from .servers import DEFAULT_BUILD, start_llama_server, start_llmserve, stop
from .targets import LOGS, PLAIN_WORKLOADS, alternate, plain_rows, report

MARKER = "<!-- noise -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("llama-server", "llmserve"), default="llama-server")
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_BUILD / "llama-server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.server == "llama-server":
        if not args.llama_server.exists():
            parser.error(f"{args.llama_server} not found: build it as bench/README.md says")
        first, url_a = start_llama_server(args.llama_server, default_model_path(), LOGS / "noise-a.log", False)
        second, url_b = start_llama_server(args.llama_server, default_model_path(), LOGS / "noise-b.log", False)
        run = loadgen.peer_level
    else:
        first, url_a = start_llmserve(LOGS / "noise-a.log")
        second, url_b = start_llmserve(LOGS / "noise-b.log")
        run = loadgen.llmserve_level
    rows = []
    try:
        for workload, prompts, num_requests in PLAIN_WORKLOADS:
            tps, ttft = alternate({"a": (run, url_a), "b": (run, url_b)}, args.rounds, f"{args.server} A/A ({workload.name})",
                                  prompts=prompts, num_requests=num_requests, workload=workload)
            rows += plain_rows(tps, ttft, "a", "b", workload.name)
    finally:
        stop(first)
        stop(second)
    report(rows, f"Measured {started} to {time.strftime('%H:%M UTC', time.gmtime())} with "
           f"`python -m bench.noise --server {args.server} --rounds {args.rounds}`: {args.server} against a second "
           f"{args.server}, same flags.", "| plain row, server A / server B | measured | goal | met by chance |",
           args.out, MARKER, missed="no")

if __name__ == "__main__":
    main()

"""Several models behind one endpoint (docs/adapters.md): what a resident second model
costs the default one, in memory and in speed, and what loading one on first use costs.

    python -m bench.models [--rounds 3] [--tokens 64] [--concurrency 1,4]

Servers (all `-np 4 -c 4096 -t 2`): ONE serves the default model alone; TWO serves it
and a Q8_0 requantization of it (tools/requantize.py) as `q8`, both resident and the
second idle; LAZY has `--models-max 2` and loads `q8` when a call first names it.
Per round, servers alternating: the project's loadgen (`rounds` workload, greedy) against
the default model at each concurrency. Also each server's RSS once loaded (VmRSS), and on
LAZY the first `q8` call's time (the load included) against the next one's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import grpc
from llmserve.client import pb, session_config
from llmserve.client.loadgen import llmserve_level
from llmserve.service.model.default_model import default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.models import other_model_path
from harness.server import RunningServer, start_server, stop_server

FLAGS = ["-np", "4", "-c", "4096", "-t", "2"]


def rss_mib(server: RunningServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def timed_call(address: str, model: str) -> float:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        config = session_config(max_tokens=8, temperature=0, ignore_eos=True, model=model)
        start = time.monotonic()
        stub.GenerateText(pb.GenerateTextRequest(config=config, input=pb.Input(text="Hello")), timeout=300)
        return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    q8 = other_model_path()
    logs = Path("/tmp/bench-models")
    logs.mkdir(exist_ok=True)
    two_models = ["-m", str(default_model_path()), "-m", f"q8={q8}"]
    servers = {"one": start_server(FLAGS, logs / "one.log"), "two": start_server([*two_models, *FLAGS], logs / "two.log")}
    try:
        rss = {name: rss_mib(server) for name, server in servers.items()}
        speeds: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for c in levels:
                for name, server in servers.items():
                    result = asyncio.run(llmserve_level(server.address, c, 3, args.tokens))
                    speeds.setdefault((name, c), []).append(result.checked().tokens_per_s)
    finally:
        for server in servers.values():
            stop_server(server)
    lazy = start_server([*two_models, *FLAGS, "--models-max", "2"], logs / "lazy.log")
    try:
        rss["lazy, q8 unloaded"] = rss_mib(lazy)
        first, second = timed_call(lazy.address, "q8"), timed_call(lazy.address, "q8")
        rss["lazy, q8 loaded"] = rss_mib(lazy)
    finally:
        stop_server(lazy)
    print("| server | RSS MiB |\n|---|---:|")
    for name, value in rss.items():
        print(f"| {name} | {value:.0f} |")
    print("\n| concurrency | one model tokens/s (median) | two models, other idle | ratio | rounds (two/one) |")
    print("|---:|---:|---:|---:|---|")
    for c in levels:
        one, two = speeds[("one", c)], speeds[("two", c)]
        ratios = ", ".join(f"{b / a:.2f}" for a, b in zip(one, two))
        print(f"| {c} | {statistics.median(one):.1f} | {statistics.median(two):.1f} | "
              f"{statistics.median(two) / statistics.median(one):.2f} | {ratios} |")
    print(f"\nlazy q8: first call {first * 1000:.0f} ms (its load included), the next {second * 1000:.0f} ms")


if __name__ == "__main__":
    main()

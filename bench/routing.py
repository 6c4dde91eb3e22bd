"""Routing policies behind Envoy, compared on one workload (issue 28).

    python -m bench.routing [--requests 48] [--tenants 6] [--rounds 1] [--policies 0,1] [--out docs/deployment.md]

3 llmserve replicas (-np 2 -t 1 each) behind the project's Envoy config, rendered per
policy. One replica is slower: 2 long generations are sent to it directly the whole
time (Envoy cannot see them). Tenants each have their own ~400-token document and ask
short questions (8 new tokens, greedy); tenant 0 is hot (a third of the calls); calls
come in bursts (4 callers, a pause every 12 calls). Policies, each on fresh replicas:

* LEAST_REQUEST, no key (the config before issue 28);
* ORCA weights, no key (client_side_weighted_round_robin on the out-of-band reports);
* Maglev on the tenant id (`x-llmserve-affinity`), bounded load;
* Maglev on a key derived from the prompt's head (the SDK's `derive_affinity`), with
  and without bounded load.

Reports per policy: prefix-cache hit rate (sum cached / sum prompt tokens), TTFT p50 and
p99, generated tokens per second over the run, and calls per replica.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from llmserve.client import Client, make_input, pb, session_config
from llmserve.client.affinity import prefix_affinity_key
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from bench.affinity import tenant_document
from bench.embed_model import write_section
from harness.envoy_cluster import Cluster

REPLICA_ARGS = ["-np", "2", "-c", "4096", "-t", "1"]
HOT_SHARE = 1 / 3
BURST = 12


@dataclass(frozen=True)
class Policy:
    name: str
    keyless: str = "orca"
    bounded_load: bool = True
    key: str = ""  # "", "tenant" or "derived"


POLICIES = (
    Policy("LEAST_REQUEST, no key", keyless="least_request"),
    Policy("ORCA weights, no key"),
    Policy("Maglev on the tenant id, bounded load", key="tenant"),
    Policy("Maglev on a derived key, bounded load", key="derived"),
    Policy("Maglev on a derived key, no bounded load", key="derived", bounded_load=False),
)


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float


def _call(channel: grpc.Channel, tenant: int, question: int, policy: Policy) -> Outcome:
    prompt = tenant_document(tenant) + f"Question {question}: what does the handbook say about item {question}?"
    request = pb.GenerateRequest(config=session_config(max_tokens=8, temperature=0), input=make_input(prompt),
                                 end_of_turn=True)
    key = {"": "", "tenant": f"tenant-{tenant}", "derived": prefix_affinity_key(request.input)}[policy.key]
    metadata = (("x-llmserve-affinity", key),) if key else ()
    start = time.perf_counter()
    ttft = None
    for response in pb_grpc.LLMServiceStub(channel).Generate(iter([request]), metadata=metadata, timeout=600):
        if ttft is None and response.HasField("chunk"):
            ttft = time.perf_counter() - start
        if response.HasField("turn_end"):
            usage = response.turn_end.usage
            return Outcome(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens,
                           ttft if ttft is not None else time.perf_counter() - start)
    raise RuntimeError("no turn end")


def _side_load(cluster: Cluster, stop: threading.Event) -> list[threading.Thread]:
    """Keep 2 long generations running on replica 0, sent to it directly."""
    client = Client(f"127.0.0.1:{cluster.replicas[0].port}", timeout=600)

    def run(i: int) -> None:
        while not stop.is_set():
            client.generate_text(f"Side story {i}:", max_tokens=200, ignore_eos=True, temperature=0.8)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    return threads


def run(policy: Policy, num_requests: int, num_tenants: int) -> dict[str, object]:
    rng = random.Random(7)
    plan = [(0 if rng.random() < HOT_SHARE else rng.randrange(1, num_tenants), q) for q in range(num_requests)]
    with tempfile.TemporaryDirectory() as directory:
        cluster = Cluster(Path(directory), replica_args=REPLICA_ARGS, keyless=policy.keyless)
        cluster.start()
        stop = threading.Event()
        try:
            side = _side_load(cluster, stop)
            time.sleep(3)  # the slower replica is busy before the first call
            before = [r.generate_calls() for r in cluster.replicas]
            start = time.perf_counter()
            results: list[Outcome] = []
            with grpc.insecure_channel(cluster.address) as channel, ThreadPoolExecutor(4) as pool:
                for first in range(0, len(plan), BURST):
                    burst = plan[first:first + BURST]
                    results += pool.map(lambda job: _call(channel, job[0], job[1], policy), burst)
                    time.sleep(1.0)
            wall = time.perf_counter() - start - 1.0 * ((len(plan) + BURST - 1) // BURST)
            time.sleep(1.0)  # a replica counts a call as it ends
            served = [int(r.generate_calls() - b) for r, b in zip(cluster.replicas, before, strict=True)]
            stop.set()
            for thread in side:
                thread.join(timeout=60)
        finally:
            stop.set()
            cluster.stop()
    ttfts = sorted(r.ttft_s for r in results)
    prompt = sum(r.prompt_tokens for r in results)
    return {
        "hit_rate": sum(r.cached_tokens for r in results) / prompt,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "tokens_per_s": sum(r.completion_tokens for r in results) / wall,
        "served": served,
    }


def table(results: dict[str, list[dict[str, object]]], command: str) -> str:
    """Medians over the rounds; calls per replica summed over them."""
    num_rounds = len(next(iter(results.values())))
    lines = [f"Measured with `{command}` ({time.strftime('%Y-%m-%d %H:%M')} UTC), replica 0 the slower one"
             + (f"; medians of {num_rounds} rounds, calls summed:" if num_rounds > 1 else ":"), "",
             "| policy | prefix-cache hit rate | TTFT p50 | TTFT p99 | tokens/s | calls per replica |",
             "|---|---|---|---|---|---|"]
    for name, rounds in results.items():
        m = {k: statistics.median(r[k] for r in rounds) for k in ("hit_rate", "ttft_p50", "ttft_p99", "tokens_per_s")}
        served = [sum(col) for col in zip(*(r["served"] for r in rounds), strict=True)]  # type: ignore[call-overload]
        lines.append(f"| {name} | {m['hit_rate']:.1%} | {m['ttft_p50'] * 1000:,.0f} ms "
                     f"| {m['ttft_p99'] * 1000:,.0f} ms | {m['tokens_per_s']:.1f} | {' / '.join(map(str, served))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1, help="every policy once per round, in turn")
    parser.add_argument("--policies", default="", help="comma-separated indices into POLICIES (default: all)")
    parser.add_argument("--out", type=Path, help="rewrite the <!-- routing --> section of this file")
    args = parser.parse_args()
    policies = [POLICIES[int(i)] for i in args.policies.split(",")] if args.policies else list(POLICIES)
    results: dict[str, list[dict[str, object]]] = {p.name: [] for p in policies}
    for round_index in range(args.rounds):
        for policy in policies:
            results[policy.name].append(run(policy, args.requests, args.tenants))
            print(f"round {round_index + 1}", policy.name, results[policy.name][-1], flush=True)
    command = f"python -m bench.routing --requests {args.requests} --tenants {args.tenants} --rounds {args.rounds}"
    text = table(results, command + (f" --policies {args.policies}" if args.policies else ""))
    print(text)
    if args.out is not None:
        write_section(args.out, f"<!-- routing -->\n{text}<!-- /routing -->", "<!-- routing -->", "<!-- /routing -->")


if __name__ == "__main__":
    main()
